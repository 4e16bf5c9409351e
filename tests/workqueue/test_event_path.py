"""The Event path: one scheduler-lease holder per generation runs its work in delivery order."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from nexus_pipelines.control import leases
from nexus_pipelines.workqueue import claims, event_path, generations
from nexus_pipelines.workqueue.dlq import list_dead
from nexus_pipelines.workqueue.handlers import HandlerRegistry, PermanentError, RetryLater
from nexus_pipelines.workqueue.receipts import NewWork, enqueue_work_items
from nexus_pipelines.workqueue.retry import RetryPolicy

from .conftest import items
from .support import FencedEffects, effects

FAST = RetryPolicy(base_s=0, cap_s=0, jitter=0)


def event_generation(conn, reg: str, work: list[NewWork]) -> list[int]:
    """An Event-path generation holding `work`; returns the work ids in delivery order."""
    generations.activate(conn, reg, 1, recorded_by="test", route_versions={"bulk": 1}, claim_path="event")
    assert enqueue_work_items(conn, work, registration_id=reg, revision=1) == len(work)
    return [r[0] for r in conn.execute(
        "SELECT work_id FROM event_executions WHERE registration_id = %s ORDER BY event_id", (reg,))]


def test_work_runs_in_delivery_order_and_a_retry_holds_only_its_source_lane(control_conn, control_dsn, reg):
    work = [NewWork(f"{reg}-{i}", "t", source_lane_key=lane) for i, lane in enumerate("ABAB")]
    a1, b1, a2, b2 = event_generation(control_conn, reg, work)
    order: list[int] = []
    all_done = threading.Event()

    def handler(item):
        order.append(item.work_id)
        if order.count(a1) == 1 and item.work_id == a1:
            raise RetryLater("provider asked to wait", 0.3)
        if len(order) == 5:
            all_done.set()
        return "ok"

    report = event_path.run_event_path(control_dsn, HandlerRegistry({"t": handler}), reg, 1, retry_policy=FAST,
                                       idle_exit=False, poll_interval_s=0.05, stop_event=all_done)
    assert (report.completed, report.retried, report.stopped) == (4, 1, "stopped")
    # a1 failed and waits: lane B goes on, a2 waits behind a1
    assert order == [a1, b1, b2, a1, a2]
    assert control_conn.execute(
        "SELECT count(*) FROM legacy_outcome_receipts WHERE registration_id = %s AND outcome = 'succeeded'", (reg,)
    ).fetchone() == (4,)


def test_one_scheduler_lease_holder_runs_a_generation(control_conn, control_dsn, reg):
    event_generation(control_conn, reg, items(2))
    held = leases.acquire(control_conn, claims.scheduler_lease_name(reg, 1), "other-executor", timedelta(seconds=30))
    ran: list[int] = []
    report = event_path.run_event_path(control_dsn, HandlerRegistry({"t": lambda item: ran.append(item.work_id)}),
                                       reg, 1)
    assert report.stopped == "lease_held" and ran == []
    leases.release(control_conn, held)
    assert event_path.run_event_path(control_dsn, HandlerRegistry({"t": lambda item: None}), reg, 1).completed == 2


def test_a_handler_whose_lease_was_taken_over_cannot_write_and_its_attempt_is_settled(
    control_conn, control_dsn, reg
):
    (work_id,) = event_generation(control_conn, reg, items(1))
    lease_name = claims.scheduler_lease_name(reg, 1)
    handler = FencedEffects(control_dsn)
    wrote: list[str] = []

    def paused(item):
        # the holder pauses past its lease, and another executor takes the lease over
        control_conn.execute("UPDATE leases SET acquired_at = now() - interval '1 hour',"
                             " expires_at = now() - interval '1 second' WHERE lease_name = %s", (lease_name,))
        leases.acquire(control_conn, lease_name, "successor", timedelta(seconds=30))
        wrote.append(handler(item))
        return "done"

    report = event_path.run_event_path(control_dsn, HandlerRegistry({"t": paused}), reg, 1, lease_ttl_s=30)
    assert wrote == ["lost"] and report.lost == 1 and report.completed == 0
    assert effects(control_conn, [work_id]) == {}
    assert control_conn.execute("SELECT state FROM event_executions WHERE work_id = %s", (work_id,)).fetchone() == (
        "started",)
    control_conn.execute("DELETE FROM leases WHERE lease_name = %s", (lease_name,))  # the successor dies too
    report = event_path.run_event_path(control_dsn, HandlerRegistry({"t": handler}), reg, 1, retry_policy=FAST)
    assert (report.interrupted, report.completed) == (1, 1)
    assert effects(control_conn, [work_id]) == {work_id: ("event", 1)}


def test_failures_of_an_event_owned_generation_are_read_from_the_event_path(control_conn, control_dsn, reg):
    (work_id,) = event_generation(control_conn, reg, items(1))
    registry = HandlerRegistry({"t": lambda item: (_ for _ in ()).throw(PermanentError("cannot map it"))})
    assert event_path.run_event_path(control_dsn, registry, reg, 1).dead == 1
    (dead,) = list_dead(control_conn, registration_id=reg)
    assert (dead.work_id, dead.claim_path, dead.failure_class) == (work_id, "event", "permanent")
    assert dead.route_id == "bulk" and dead.namespace == "bulk"


def test_the_executor_stops_when_its_generation_stops_admitting_event_work(control_conn, control_dsn, reg):
    ids = event_generation(control_conn, reg, items(3))
    gate_closed = threading.Event()

    def handler(item):
        if not gate_closed.is_set():
            generations.quiesce(control_conn, reg, 1, recorded_by="op")
            gate_closed.set()
        return "ok"

    report = event_path.run_event_path(control_dsn, HandlerRegistry({"t": handler}), reg, 1)
    assert (report.completed, report.stopped) == (1, "not_admitted")
    assert generations.drain_status(control_conn, reg, 1).drained
    assert len(ids) == 3


@pytest.mark.parametrize("owner", ["work_item", "none"])
def test_an_event_path_activation_is_refused_for_a_work_item_generation(control_conn, reg, owner):
    enqueue_work_items(control_conn, items(1), registration_id=reg, revision=1)
    if owner == "work_item":
        generations.activate(control_conn, reg, 1, recorded_by="op", route_versions={})
    with pytest.raises(generations.GenerationGateError, match="roll it back|claimable work items"):
        generations.activate(control_conn, reg, 1, recorded_by="op", route_versions={}, claim_path="event")


def test_confirming_an_outcome_needs_an_unknown_one(control_conn, reg):
    (work_id,) = event_generation(control_conn, reg, items(1))
    with pytest.raises(event_path.ConfirmRefused):
        event_path.confirm(control_conn, work_id, "succeeded", recorded_by="op")


def test_the_event_path_starts_only_work_types_its_registry_handles(control_conn, control_dsn, reg):
    known, unknown_type, behind = event_generation(
        control_conn, reg, [NewWork(f"{reg}-a", "known"), NewWork(f"{reg}-b", "elsewhere", source_lane_key="L"),
                            NewWork(f"{reg}-c", "known", source_lane_key="L")])
    ran: list[int] = []
    report = event_path.run_event_path(control_dsn, HandlerRegistry({"known": lambda item: ran.append(item.work_id)}),
                                       reg, 1)
    assert ran == [known] and report.dead == 0
    # the other work type waits for its handler, and its source lane keeps its order behind it
    assert dict(control_conn.execute(
        "SELECT work_id, state FROM event_executions WHERE work_id = ANY(%s)", ([unknown_type, behind],)
    ).fetchall()) == {unknown_type: "pending", behind: "pending"}
