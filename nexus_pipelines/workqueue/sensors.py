"""Sensors: launch drains, Event-path runs and receipt routers when due work exists.

A tick reads only bounded index probes (due items per queue class, due receipts, due
Event executions per Event-owned generation) and Dagster's own run counts. Run keys are deterministic per time bucket and queue
class (`workqueue-drain:<class>:<bucket>:<n>`), so a repeated tick in the same
bucket launches nothing new; the number of drains in flight is capped here and by
the run coordinator's `nexus/queue-drain` tag limit.
"""


import math
import time
from collections.abc import Sequence

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from nexus_pipelines.control.resources import ControlPlaneResource
from nexus_pipelines.workqueue import stats
from nexus_pipelines.workqueue.jobs import DRAIN_TAG, EVENT_PATH_TAG, ROUTER_TAG
from nexus_pipelines.workqueue.registry import QUEUE_CLASSES

MAX_CONCURRENT_DRAINS = 4
MAX_CONCURRENT_ROUTERS = 2
ITEMS_PER_DRAIN = 10_000
BUCKET_S = 60
IN_FLIGHT = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
]


def _in_flight(context: SensorEvaluationContext, job_name: str) -> int:
    return context.instance.get_runs_count(RunsFilter(job_name=job_name, statuses=IN_FLIGHT))


def drain_requests(
    due: dict[str, int], *, in_flight: int, bucket: int, job_name: str, max_concurrent: int = MAX_CONCURRENT_DRAINS
) -> list[RunRequest]:
    requests: list[RunRequest] = []
    free = max(max_concurrent - in_flight, 0)
    for queue_class, count in sorted(due.items()):
        wanted = min(math.ceil(count / ITEMS_PER_DRAIN), free - len(requests))
        for n in range(max(wanted, 0)):
            requests.append(
                RunRequest(
                    run_key=f"{job_name}:{queue_class}:{bucket}:{n}",
                    run_config={"ops": {f"{job_name}_op": {"config": {"queue_classes": [queue_class]}}}},
                    tags={DRAIN_TAG: queue_class, "nexus/queue-class": queue_class},
                )
            )
    return requests


def build_drain_sensor(job, queue_classes: Sequence[str] = QUEUE_CLASSES):
    @sensor(
        name=f"{job.name}_sensor",
        job=job,
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.STOPPED,
        description="Launches drains while claimable work is due (capped concurrent drains).",
    )
    def drain_sensor(context: SensorEvaluationContext, control_plane: ControlPlaneResource):
        in_flight = _in_flight(context, job.name)
        if in_flight >= MAX_CONCURRENT_DRAINS:
            return SkipReason(f"{in_flight} drains already queued or running")
        with control_plane.connection() as conn:
            # count up to what the free drains can take, or the backlog never scales past one drain
            cap = ITEMS_PER_DRAIN * (MAX_CONCURRENT_DRAINS - in_flight)
            due = {k: v for k, v in stats.due_work(conn, queue_classes, cap=cap).items() if v > 0}
        if not due:
            return SkipReason("no due work items in active generations")
        bucket = int(time.time() // BUCKET_S)
        return drain_requests(due, in_flight=in_flight, bucket=bucket, job_name=job.name)

    return drain_sensor


def build_event_path_sensor(job):
    @sensor(
        name=f"{job.name}_sensor",
        job=job,
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.STOPPED,
        description="Launches one Event-path run per Event-owned generation with due work and no lease holder.",
    )
    def event_path_sensor(context: SensorEvaluationContext, control_plane: ControlPlaneResource):
        with control_plane.connection() as conn:
            due = stats.due_event_paths(conn)
        if not due:
            return SkipReason("no Event-owned generation has due work without a scheduler lease holder")
        bucket = int(time.time() // BUCKET_S)
        return [
            RunRequest(
                run_key=f"{job.name}:{reg}@{rev}:{bucket}",
                run_config={"ops": {f"{job.name}_op": {"config": {"registration_id": reg, "revision": rev}}}},
                tags={EVENT_PATH_TAG: f"{reg}@{rev}"},
            )
            for reg, rev, _count in due
        ]

    return event_path_sensor


def build_router_sensor(job):
    @sensor(
        name=f"{job.name}_sensor",
        job=job,
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.STOPPED,
        description="Launches a receipt router while receipts are due.",
    )
    def router_sensor(context: SensorEvaluationContext, control_plane: ControlPlaneResource):
        in_flight = _in_flight(context, job.name)
        if in_flight >= MAX_CONCURRENT_ROUTERS:
            return SkipReason(f"{in_flight} routers already queued or running")
        with control_plane.connection() as conn:
            due = stats.due_receipts(conn)
        if due == 0:
            return SkipReason("no due receipts")
        bucket = int(time.time() // BUCKET_S)
        return [RunRequest(run_key=f"{job.name}:{bucket}", tags={ROUTER_TAG: "router"})]

    return router_sensor
