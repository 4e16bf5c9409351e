"""The poll sensor: launches a poll run per due registration revision.

A tick reads one indexed probe (due active revisions) and one Dagster runs query (poll
runs in flight); it launches no run for a registration that already has one queued or
running. Run keys are deterministic per registration revision and minute.
"""

import time

from dagster import DefaultSensorStatus, RunRequest, RunsFilter, SensorEvaluationContext, SkipReason, sensor

from nexus_pipelines.connectors.core import store
from nexus_pipelines.connectors.jobs import POLL_TAG, connectors_poll_job
from nexus_pipelines.control.resources import ControlPlaneResource
from nexus_pipelines.workqueue.sensors import IN_FLIGHT

BUCKET_S = 60
MAX_REQUESTS_PER_TICK = 200


def poll_requests(due: list[tuple[str, str, int]], busy: set[str], bucket: int) -> list[RunRequest]:
    return [
        RunRequest(
            run_key=f"connectors_poll:{rid}:{revision_id}:{bucket}",
            run_config={"ops": {"connectors_poll_op": {"config": {"registrations": [rid]}}}},
            tags={POLL_TAG: rid},
        )
        for rid, revision_id, _ in due
        if rid not in busy
    ][:MAX_REQUESTS_PER_TICK]


@sensor(job=connectors_poll_job, minimum_interval_seconds=30, default_status=DefaultSensorStatus.STOPPED,
        description="Launches a poll run for each due connector registration (one in flight per registration).")
def connectors_poll_sensor(context: SensorEvaluationContext, control_plane: ControlPlaneResource):
    with control_plane.connection() as conn:
        due = store.due_registrations(conn, limit=MAX_REQUESTS_PER_TICK * 2)
    if not due:
        return SkipReason("no connector registration is due")
    runs = context.instance.get_runs(RunsFilter(job_name=connectors_poll_job.name, statuses=IN_FLIGHT), limit=1000)
    busy = {run.tags.get(POLL_TAG) for run in runs}
    requests = poll_requests(due, busy, int(time.time() // BUCKET_S))
    return requests or SkipReason(f"{len(due)} due registrations already have poll runs in flight")
