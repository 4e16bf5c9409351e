from __future__ import annotations

from dagster import DagsterInstance, SkipReason, build_sensor_context

from nexus_pipelines.control.resources import ControlPlaneResource
from nexus_pipelines.workqueue.assets import WORKQUEUE_HEALTH
from nexus_pipelines.workqueue.handlers import HandlerRegistry
from nexus_pipelines.workqueue.jobs import DRAIN_TAG, build_drain_job, build_router_job
from nexus_pipelines.workqueue.receipts import EventSpec, ReceiptIn, Route, WorkSpec, admit_receipt
from nexus_pipelines.workqueue.sensors import build_drain_sensor, build_router_sensor, drain_requests

from .conftest import enqueue, items

seen: list[int] = []


def _handler(item) -> str:
    seen.append(item.work_id)
    return "succeeded"


def test_defs_load_with_the_work_queue():
    from nexus_pipelines.definitions import defs

    repo = defs.get_repository_def()
    assert {"workqueue_drain", "workqueue_event_path", "workqueue_receipt_router", "workqueue_health"} <= {
        j.name for j in repo.get_all_jobs()}
    assert {"workqueue_drain_sensor", "workqueue_event_path_sensor", "workqueue_receipt_router_sensor"} <= {
        s.name for s in repo.sensor_defs}


def test_drain_job_executes_in_process_and_observes_health(control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(7, "dagster.test"))
    job = build_drain_job(lambda pool: HandlerRegistry({"dagster.test": _handler}), name="test_drain")
    instance = DagsterInstance.ephemeral()
    result = job.execute_in_process(
        run_config={"ops": {"test_drain_op": {"config": {"registration_ids": [reg], "concurrency": 2, "time_budget_s": 30}}}},
        resources={"control_plane": ControlPlaneResource(dsn=control_dsn)},
        instance=instance,
    )
    assert result.success
    summary = result.output_for_node("test_drain_op")
    assert summary["completed"] == 7 and summary["lost"] == 0
    observations = [
        e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"
    ]
    assert observations and observations[0].asset_key == WORKQUEUE_HEALTH
    assert result.dagster_run.tags[DRAIN_TAG] == "drain"


def test_router_job_materializes_receipts(control_conn, control_dsn, reg):
    from datetime import datetime, timezone

    admit_receipt(
        control_conn,
        ReceiptIn(registration_id=reg, revision=1, namespace="n", delivery_id="d1", route_key="k",
                  received_at=datetime.now(timezone.utc), body={"id": "X"}),
    )
    routes = {"k": Route("k", 1, lambda r: [EventSpec("obj", r.body["id"], f"{reg}:X", [WorkSpec("w")])])}
    job = build_router_job(lambda: routes, name="test_router")
    result = job.execute_in_process(resources={"control_plane": ControlPlaneResource(dsn=control_dsn)})
    assert result.success and result.output_for_node("test_router_op")["materialized"] >= 1
    (count,) = control_conn.execute("SELECT count(*) FROM connector_work_items WHERE registration_id = %s", (reg,)).fetchone()
    assert count == 1


def test_drain_sensor_requests_capped_runs_with_deterministic_keys(control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(3, queue_class="sensor-test"))
    job = build_drain_job(lambda: HandlerRegistry({"t": _handler}), name="sensor_drain")
    sensor = build_drain_sensor(job, queue_classes=["sensor-test", "empty-class"])
    instance = DagsterInstance.ephemeral()
    with build_sensor_context(
        instance=instance, resources={"control_plane": ControlPlaneResource(dsn=control_dsn)}
    ) as context:
        result = sensor(context)
    requests = list(result) if not isinstance(result, SkipReason) else []
    assert len(requests) == 1
    (request,) = requests
    assert request.run_key.startswith("sensor_drain:sensor-test:")
    assert request.tags[DRAIN_TAG] == "sensor-test"
    assert request.run_config["ops"]["sensor_drain_op"]["config"]["queue_classes"] == ["sensor-test"]
    # same bucket, same key
    with build_sensor_context(
        instance=instance, resources={"control_plane": ControlPlaneResource(dsn=control_dsn)}
    ) as context:
        again = list(sensor(context))
    assert [r.run_key for r in again] == [request.run_key]


def test_drain_requests_respect_the_cap():
    reqs = drain_requests({"a": 25_000, "b": 5}, in_flight=1, bucket=7, job_name="j", max_concurrent=4)
    assert [r.run_key for r in reqs] == ["j:a:7:0", "j:a:7:1", "j:a:7:2"]
    assert drain_requests({"a": 5}, in_flight=4, bucket=7, job_name="j", max_concurrent=4) == []


def test_router_sensor_skips_without_due_receipts(control_dsn):
    sensor = build_router_sensor(build_router_job(lambda: {}, name="idle_router"))
    with build_sensor_context(
        instance=DagsterInstance.ephemeral(), resources={"control_plane": ControlPlaneResource(dsn=control_dsn)}
    ) as ctx:
        result = sensor(ctx)
    assert isinstance(result, SkipReason) or list(result)


def test_queue_health_reports_depth_leases_and_oldest_due(control_conn, reg):
    from datetime import timedelta

    from nexus_pipelines.workqueue import claims
    from nexus_pipelines.workqueue.stats import due_work, queue_health

    enqueue(control_conn, reg, items(3, queue_class="health-a") + items(2, queue_class="health-b"))
    control_conn.execute(
        "UPDATE connector_work_items SET run_after = now() - interval '90 seconds'"
        " WHERE registration_id = %s AND queue_class = 'health-b'",
        (reg,),
    )
    claims.claim_batch(control_conn, owner="w", limit=1, lease_ttl=timedelta(seconds=30), registration_ids=[reg],
                       queue_classes=["health-a"])
    health = queue_health(control_conn)
    assert health["depth_by_queue_class"]["health-a"] == {"pending": 2, "running": 1}
    assert health["depth_by_queue_class"]["health-b"] == {"pending": 2}
    assert health["active_leases"] >= 1 and health["oldest_due_age_s"] >= 90
    assert due_work(control_conn, ["health-a", "health-b", "none"]) == {"health-a": 2, "health-b": 2, "none": 0}


def test_drain_sensor_scales_drains_with_a_backlog_beyond_one_drain(control_conn, control_dsn, reg):
    from nexus_pipelines.workqueue import sensors

    backlog = 2 * sensors.ITEMS_PER_DRAIN + 1
    enqueue(control_conn, reg, items(backlog, queue_class="sensor-backlog"))
    job = build_drain_job(lambda: HandlerRegistry({"t": _handler}), name="backlog_drain")
    sensor = build_drain_sensor(job, queue_classes=["sensor-backlog"])
    with build_sensor_context(
        instance=DagsterInstance.ephemeral(), resources={"control_plane": ControlPlaneResource(dsn=control_dsn)}
    ) as context:
        result = sensor(context)
    requests = list(result) if not isinstance(result, SkipReason) else []
    assert len(requests) == 3  # one drain per ITEMS_PER_DRAIN due items, under the cap of concurrent drains


def test_the_event_path_job_runs_an_event_owned_generation_with_the_same_registry_factory(
    control_conn, control_dsn, reg
):
    from nexus_pipelines.workqueue.jobs import build_event_path_job

    from .support import roll_back

    enqueue(control_conn, reg, items(4, "dagster.test"))
    roll_back(control_conn, reg)
    built: list = []

    def factory(pool):
        built.append(pool)
        return HandlerRegistry({"dagster.test": _handler})

    job = build_event_path_job(factory, name="test_event_path")
    result = job.execute_in_process(
        run_config={"ops": {"test_event_path_op": {"config": {"registration_id": reg, "revision": 1}}}},
        resources={"control_plane": ControlPlaneResource(dsn=control_dsn)},
    )
    assert result.success and len(built) == 1
    summary = result.output_for_node("test_event_path_op")
    assert (summary["completed"], summary["reconciled"], summary["stopped"]) == (4, 4, "idle")
    observation = next(e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION")
    metadata = observation.event_specific_data.asset_observation.metadata
    assert metadata["fences"].value["reconciled_legacy_terminal"] >= 4


def test_the_event_path_sensor_requests_one_run_per_event_owned_generation_without_a_lease_holder(
    control_conn, control_dsn, reg
):
    from datetime import timedelta

    from nexus_pipelines.control import leases
    from nexus_pipelines.workqueue.claims import scheduler_lease_name
    from nexus_pipelines.workqueue.jobs import EVENT_PATH_TAG, build_event_path_job
    from nexus_pipelines.workqueue.sensors import build_event_path_sensor

    from .support import roll_back

    enqueue(control_conn, reg, items(2, "dagster.test"))
    roll_back(control_conn, reg)
    sensor = build_event_path_sensor(build_event_path_job(lambda pool: HandlerRegistry({}), name="sensor_events"))

    def tick():
        with build_sensor_context(instance=DagsterInstance.ephemeral(),
                                  resources={"control_plane": ControlPlaneResource(dsn=control_dsn)}) as context:
            result = sensor(context)
        return [] if isinstance(result, SkipReason) else [r for r in result if r.tags[EVENT_PATH_TAG] == f"{reg}@1"]

    (request,) = tick()
    assert request.run_config["ops"]["sensor_events_op"]["config"] == {"registration_id": reg, "revision": 1}
    held = leases.acquire(control_conn, scheduler_lease_name(reg, 1), "running-executor", timedelta(seconds=30))
    assert tick() == []  # a run already holds the generation
    leases.release(control_conn, held)
    assert len(tick()) == 1
