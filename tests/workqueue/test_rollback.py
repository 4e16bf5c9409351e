"""The rollback matrix (docs/design/work-queue.md, "Rollback to the Event path" and
"Reconciliation and re-cutover"), on real Postgres.

Pending work item -> rollback fence -> legacy success / terminal failure -> reconciliation
receipt -> re-cutover; duplicate terminal delivery; a crash between the receipt and its
projection; an ambiguous legacy outcome blocking the re-cutover; a reconciled row never
reopened; a new event materialized at re-cutover; rollbacks refused while an item is
running, leased or dispatched.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from nexus_pipelines.workqueue import claims, event_path, generations, legacy_outcomes, rollback
from nexus_pipelines.workqueue.dlq import ReplayRefused, list_dead, replay
from nexus_pipelines.workqueue.handlers import HandlerRegistry, PermanentError
from nexus_pipelines.workqueue.receipts import (
    EventSpec,
    ReceiptIn,
    Route,
    WorkSpec,
    admit_receipt,
    enqueue_work_items,
    route_receipts,
)
from nexus_pipelines.workqueue.retry import RetryPolicy
from nexus_pipelines.workqueue.worker import drain

from .conftest import enqueue, expire_leases, items
from .support import FencedEffects, effects, recutover, roll_back, states, work_ids

TTL = timedelta(seconds=30)
FAST = RetryPolicy(base_s=0, cap_s=0, jitter=0)


def _receipts(conn, work_id: int) -> list[tuple]:
    return conn.execute(
        "SELECT version, outcome, digest FROM legacy_outcome_receipts WHERE work_id = %s ORDER BY version", (work_id,)
    ).fetchall()


def _item(conn, work_id: int) -> tuple:
    return conn.execute(
        """SELECT state, rollback_fence_id, legacy_outcome_receipt_version, legacy_outcome_digest, outcome
             FROM connector_work_items WHERE work_id = %s""",
        (work_id,),
    ).fetchone()


# --- the matrix -----------------------------------------------------------------------------


def test_a_fenced_pending_item_runs_once_on_the_event_path_and_is_reconciled_before_recutover(
    control_conn, control_dsn, reg
):
    enqueue(control_conn, reg, items(3, "t"))
    first, *fenced_ids = work_ids(control_conn, reg)
    handler = FencedEffects(control_dsn)
    registry = HandlerRegistry({"t": handler})
    assert drain(control_dsn, registry, registration_ids=[reg], max_items=1).completed == 1

    fence = roll_back(control_conn, reg)
    assert fence.proof["fenced_items"] == 2 and fence.proof["running_items"] == 0
    assert {w: _item(control_conn, w)[:2] for w in fenced_ids} == {
        w: ("awaiting_legacy_outcome", fence.receipt_id) for w in fenced_ids}
    assert drain(control_dsn, registry, registration_ids=[reg]).claimed == 0  # the WorkItem path has nothing

    report = event_path.run_event_path(control_dsn, registry, reg, 1)
    assert (report.completed, report.reconciled) == (2, 2)
    for work_id in fenced_ids:
        ((version, outcome, digest),) = _receipts(control_conn, work_id)
        assert (outcome, version) == ("succeeded", 1)
        assert _item(control_conn, work_id) == ("reconciled_legacy_terminal", fence.receipt_id, 1, digest,
                                                "legacy:succeeded")

    receipt = recutover(control_conn, reg)
    assert receipt.kind == "activation" and receipt.proof["cutover"]["fences"][str(fence.receipt_id)][
        "fenced_items"] == 2
    assert generations.drain_status(control_conn, reg, 1).claim_path == "work_item"
    assert drain(control_dsn, registry, registration_ids=[reg]).claimed == 0  # nothing runs twice
    assert effects(control_conn, [first, *fenced_ids]) == {
        first: ("work_item", 1), **{w: ("event", 1) for w in fenced_ids}}
    assert sorted(handler.calls) == sorted([(first, "work_item")] + [(w, "event") for w in fenced_ids])


def test_a_legacy_terminal_failure_is_reconciled_and_never_retried_after_recutover(control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(1, "t"))
    (work_id,) = work_ids(control_conn, reg)
    roll_back(control_conn, reg)
    failing = HandlerRegistry({"t": FencedEffects(control_dsn, fail=lambda item: PermanentError("rejected"))})
    report = event_path.run_event_path(control_dsn, failing, reg, 1)
    assert (report.dead, report.reconciled) == (1, 1)
    ((version, outcome, digest),) = _receipts(control_conn, work_id)
    assert outcome == "failed"
    assert [d.claim_path for d in list_dead(control_conn, registration_id=reg)] == ["event"]  # the Event path's DLQ

    recutover(control_conn, reg)
    assert _item(control_conn, work_id) == ("reconciled_legacy_terminal", _item(control_conn, work_id)[1], version,
                                            digest, "legacy:failed")
    succeeding = HandlerRegistry({"t": FencedEffects(control_dsn)})
    assert drain(control_dsn, succeeding, registration_ids=[reg]).claimed == 0
    assert list_dead(control_conn, registration_id=reg) == []  # a WorkItem generation reads work items only


def test_a_duplicate_terminal_delivery_changes_nothing(control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(1, "t"))
    (work_id,) = work_ids(control_conn, reg)
    roll_back(control_conn, reg)
    event_path.run_event_path(control_dsn, HandlerRegistry({"t": FencedEffects(control_dsn)}), reg, 1)
    before = _item(control_conn, work_id)
    ((_, _, digest),) = _receipts(control_conn, work_id)
    token, fence = control_conn.execute(
        "SELECT execution_token, rollback_fence_id FROM legacy_outcome_receipts WHERE work_id = %s", (work_id,)
    ).fetchone()
    execution = legacy_outcomes.Execution(work_id, *control_conn.execute(
        "SELECT event_id, work_type, registration_id, revision FROM event_executions WHERE work_id = %s", (work_id,)
    ).fetchone(), fence)
    with control_conn.transaction():
        again = legacy_outcomes.record(control_conn, execution, "succeeded", token=token, detail={}, recorded_by="x")
    assert again.digest == digest and again.version == 1
    with pytest.raises(legacy_outcomes.ConflictingOutcome), control_conn.transaction():
        legacy_outcomes.record(control_conn, execution, "failed", token=token, detail={}, recorded_by="x")
    assert legacy_outcomes.project(control_conn, reg, 1) == 0
    assert _receipts(control_conn, work_id) == [(1, "succeeded", digest)]
    assert _item(control_conn, work_id) == before


def _crash_on_second_item(dsn: str, reg: str, second: int) -> None:
    """An Event-path executor that dies in the middle of the second item's handler."""
    handler = FencedEffects(dsn)

    def run(item):
        if item.work_id == second:
            os.kill(os.getpid(), signal.SIGKILL)
        return handler(item)

    event_path.run_event_path(dsn, HandlerRegistry({"t": run}), reg, 1, lease_ttl_s=1.0, project_every_s=3600)


def _run_crashing_executor(dsn: str, reg: str, second: int) -> None:
    proc = multiprocessing.get_context("spawn").Process(target=_crash_on_second_item, args=(dsn, reg, second))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL


def _wait_for_lease_expiry(conn, reg: str) -> None:
    conn.execute("SELECT pg_sleep(greatest(extract(epoch FROM max(expires_at) - clock_timestamp()), 0) + 0.05)"
                 " FROM leases WHERE lease_name = %s", (claims.scheduler_lease_name(reg, 1),))


@pytest.mark.slow
def test_a_crash_after_the_receipt_commit_and_before_the_projection_is_repaired_from_the_receipt(
    control_conn, control_dsn, reg
):
    enqueue(control_conn, reg, items(2, "t"))
    first, second = work_ids(control_conn, reg)
    roll_back(control_conn, reg)
    _run_crashing_executor(control_dsn, reg, second)
    # the first item's terminal outcome and its receipt committed; its projection never ran
    ((version, outcome, digest),) = _receipts(control_conn, first)
    assert outcome == "succeeded" and _item(control_conn, first)[0] == "awaiting_legacy_outcome"
    assert control_conn.execute("SELECT state FROM event_executions WHERE work_id = %s", (second,)).fetchone() == (
        "started",)

    _wait_for_lease_expiry(control_conn, reg)
    report = event_path.run_event_path(control_dsn, HandlerRegistry({"t": FencedEffects(control_dsn)}), reg, 1,
                                       retry_policy=FAST)
    assert (report.interrupted, report.completed, report.reconciled) == (1, 1, 2)
    assert _item(control_conn, first)[:4] == ("reconciled_legacy_terminal", _item(control_conn, first)[1], version,
                                              digest)
    assert _receipts(control_conn, first) == [(version, outcome, digest)]  # repaired from it, not rewritten
    assert effects(control_conn, [first, second]) == {first: ("event", 1), second: ("event", 1)}
    recutover(control_conn, reg)


@pytest.mark.slow
def test_an_unknown_legacy_outcome_blocks_recutover_until_an_operator_confirms_it(control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(1, "t") + items(1, "t", max_attempts=1))
    first, second = work_ids(control_conn, reg)
    roll_back(control_conn, reg)
    _run_crashing_executor(control_dsn, reg, second)
    _wait_for_lease_expiry(control_conn, reg)
    # the next holder finds the attempt interrupted with the budget spent: its effect may or may not exist
    report = event_path.run_event_path(control_dsn, HandlerRegistry({"t": FencedEffects(control_dsn)}), reg, 1)
    assert (report.interrupted, report.unknown) == (1, 1)
    assert [r[1] for r in _receipts(control_conn, second)] == ["unknown"]
    assert _item(control_conn, second)[0] == "awaiting_legacy_outcome"  # non-executable, quarantined

    generations.quiesce(control_conn, reg, 1, recorded_by="op")
    with pytest.raises(generations.GenerationGateError, match=f"unknown legacy outcome .*work {second}"):
        generations.activate(control_conn, reg, 1, recorded_by="op", route_versions={"bulk": 1})
    assert generations.drain_status(control_conn, reg, 1).claim_path == "event"

    confirmed, reconciled = event_path.confirm(control_conn, second, "succeeded", recorded_by="op")
    assert (confirmed.version, reconciled) == (2, 1)
    recutover(control_conn, reg)
    assert _item(control_conn, second)[:3] == ("reconciled_legacy_terminal", _item(control_conn, second)[1], 2)


def test_a_reconciled_row_is_never_reopened_reset_reused_or_duplicated(control_conn, control_dsn, reg):
    batch = items(1, "t")
    enqueue(control_conn, reg, batch)
    (work_id,) = work_ids(control_conn, reg)
    roll_back(control_conn, reg)
    registry = HandlerRegistry({"t": FencedEffects(control_dsn)})
    event_path.run_event_path(control_dsn, registry, reg, 1)
    recutover(control_conn, reg)
    reconciled = _item(control_conn, work_id)

    for statement in ("UPDATE connector_work_items SET state = 'pending' WHERE work_id = %s",
                      "UPDATE connector_work_items SET attempts = 0, legacy_outcome_digest = 'x' WHERE work_id = %s",
                      "DELETE FROM connector_work_items WHERE work_id = %s"):
        with pytest.raises(psycopg.errors.IntegrityConstraintViolation, match="reconciled_legacy_terminal"):
            control_conn.execute(statement, (work_id,))
    with pytest.raises(ReplayRefused):
        replay(control_conn, work_id, requested_by="op")
    # the same delivery again, after the re-cutover: its (event, work type) row already exists
    assert enqueue_work_items(control_conn, batch, registration_id=reg, revision=1) == 0
    with pytest.raises(psycopg.errors.UniqueViolation):
        control_conn.execute(
            """INSERT INTO connector_work_items (event_id, registration_id, revision, work_type)
               SELECT event_id, registration_id, revision, work_type FROM connector_work_items WHERE work_id = %s""",
            (work_id,),
        )
    assert drain(control_dsn, registry, registration_ids=[reg]).claimed == 0
    assert _item(control_conn, work_id) == reconciled
    assert effects(control_conn, [work_id]) == {work_id: ("event", 1)}


@pytest.mark.parametrize("statement", [
    "TRUNCATE connector_work_items CASCADE",
    "TRUNCATE connector_work_items, workqueue_replays",
])
def test_work_items_cannot_be_truncated_away_with_their_reconciled_rows(control_conn, control_dsn, reg, statement):
    enqueue(control_conn, reg, items(1, "t"))
    (work_id,) = work_ids(control_conn, reg)
    roll_back(control_conn, reg)
    event_path.run_event_path(control_dsn, HandlerRegistry({"t": FencedEffects(control_dsn)}), reg, 1)
    recutover(control_conn, reg)
    with pytest.raises(psycopg.errors.IntegrityConstraintViolation, match="connector_work_items"):
        control_conn.execute(statement)
    assert _item(control_conn, work_id)[0] == "reconciled_legacy_terminal"


def test_a_new_event_with_no_work_item_row_becomes_a_work_item_at_recutover(control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(1, "t"))
    roll_back(control_conn, reg)
    # routed while the Event path owns the generation: Event executions, no work item rows
    for delivery, key in (("d-ran", "ran"), ("d-new", "new")):
        admit_receipt(control_conn, ReceiptIn(registration_id=reg, revision=1, namespace="n", delivery_id=delivery,
                                              route_key="k", received_at=datetime.now(timezone.utc), body={"id": key}))
    routes = {"k": Route("k", 1, lambda r: [EventSpec("obj", r.body["id"], f"{reg}:{r.body['id']}", [WorkSpec("t")])])}
    assert route_receipts(control_conn, routes, owner="router").materialized == 2
    fenced, ran, new = control_conn.execute(
        "SELECT work_id FROM event_executions WHERE registration_id = %s ORDER BY work_id", (reg,)).fetchall()
    assert control_conn.execute(
        "SELECT count(*) FROM connector_work_items WHERE work_id = ANY(%s)", ([ran[0], new[0]],)).fetchone() == (0,)
    handler = FencedEffects(control_dsn)
    event_path.run_event_path(control_dsn, HandlerRegistry({"t": handler}), reg, 1, max_items=2)  # fenced, ran

    receipt = recutover(control_conn, reg)
    assert receipt.proof["cutover"]["materialized_work_items"] == 1
    assert states(control_conn, reg) == {fenced[0]: "reconciled_legacy_terminal", new[0]: "pending"}
    assert control_conn.execute("SELECT state FROM event_executions WHERE work_id = %s", (new[0],)).fetchone() == (
        "transferred",)
    assert drain(control_dsn, HandlerRegistry({"t": handler}), registration_ids=[reg]).completed == 1
    assert effects(control_conn, [fenced[0], ran[0], new[0]]) == {
        fenced[0]: ("event", 1), ran[0]: ("event", 1), new[0]: ("work_item", 1)}


def _executions(conn, reg: str) -> dict[int, tuple]:
    return {r[0]: r[1:] for r in conn.execute(
        "SELECT work_id, state, rollback_fence_id, attempts FROM event_executions WHERE registration_id = %s",
        (reg,)).fetchall()}


def test_a_generation_rolls_back_cuts_over_and_rolls_back_again(control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(1, "t"))
    (fenced_first,) = work_ids(control_conn, reg)
    handler = FencedEffects(control_dsn)
    registry = HandlerRegistry({"t": handler})
    first_fence = roll_back(control_conn, reg)
    event_path.run_event_path(control_dsn, registry, reg, 1)
    # routed while the Event path owns the generation, not run by it: the cutover hands them over
    enqueue_work_items(control_conn, items(2, "t"), registration_id=reg, revision=1)
    ran_as_item, fenced_again = sorted(set(_executions(control_conn, reg)) - {fenced_first})
    recutover(control_conn, reg)
    assert drain(control_dsn, registry, registration_ids=[reg], max_items=1).completed == 1
    assert states(control_conn, reg) == {fenced_first: "reconciled_legacy_terminal", ran_as_item: "completed",
                                         fenced_again: "pending"}

    second_fence = roll_back(control_conn, reg)
    assert second_fence.proof["fenced_items"] == 1
    assert states(control_conn, reg)[fenced_again] == "awaiting_legacy_outcome"
    assert _executions(control_conn, reg) == {
        fenced_first: ("succeeded", first_fence.receipt_id, 1),
        ran_as_item: ("transferred", None, 0),  # its work item ran it: the Event path never does
        fenced_again: ("pending", second_fence.receipt_id, 0),  # re-armed under the new fence
    }
    assert _receipts(control_conn, fenced_again) == []  # it never reached an outcome on the Event path

    # the Event path runs the re-armed work once, and new work arrives while it owns the generation
    enqueue_work_items(control_conn, items(1, "t"), registration_id=reg, revision=1)
    (late,) = set(_executions(control_conn, reg)) - {fenced_first, ran_as_item, fenced_again}
    report = event_path.run_event_path(control_dsn, registry, reg, 1, max_items=1)
    assert (report.completed, report.reconciled) == (1, 1)
    ((version, outcome, digest),) = _receipts(control_conn, fenced_again)
    assert (version, outcome) == (1, "succeeded")
    assert _item(control_conn, fenced_again) == ("reconciled_legacy_terminal", second_fence.receipt_id, 1, digest,
                                                 "legacy:succeeded")

    receipt = recutover(control_conn, reg)
    assert set(receipt.proof["cutover"]["fences"]) == {str(first_fence.receipt_id), str(second_fence.receipt_id)}
    assert receipt.proof["cutover"]["materialized_work_items"] == 1
    assert drain(control_dsn, registry, registration_ids=[reg]).completed == 1
    assert states(control_conn, reg) == {fenced_first: "reconciled_legacy_terminal", ran_as_item: "completed",
                                         fenced_again: "reconciled_legacy_terminal", late: "completed"}
    every = [fenced_first, ran_as_item, fenced_again, late]
    assert effects(control_conn, every) == {fenced_first: ("event", 1), ran_as_item: ("work_item", 1),
                                            fenced_again: ("event", 1), late: ("work_item", 1)}
    assert sorted(handler.calls) == sorted([(fenced_first, "event"), (ran_as_item, "work_item"),
                                            (fenced_again, "event"), (late, "work_item")])
    assert control_conn.execute(
        "SELECT count(*), count(DISTINCT (event_id, work_type)) FROM connector_work_items WHERE registration_id = %s",
        (reg,)).fetchone() == (4, 4)


# --- refusals ---------------------------------------------------------------------------------


def _claim(conn, reg):
    (item,) = claims.claim_batch(conn, owner="w", limit=1, lease_ttl=TTL, registration_ids=[reg])
    return item


def _running(conn, reg):
    return _claim(conn, reg)


def _expired(conn, reg):
    item = _claim(conn, reg)
    expire_leases(conn, reg)
    return item


def _dispatched_retry(conn, reg):
    item = _claim(conn, reg)
    claims.retry(conn, item, "Timeout", "provider timed out", policy=FAST)
    return item


def _reclaimed(conn, reg):
    item = _claim(conn, reg)
    expire_leases(conn, reg)
    claims.reclaim_expired(conn, policy=FAST)
    return item


def _replayed(conn, reg):
    item = _claim(conn, reg)
    claims.fail(conn, item, "Rejected", "no")
    replay(conn, item.work_id, requested_by="op")
    return item


@pytest.mark.parametrize("make, kind", [
    (_running, "running"), (_expired, "expired"), (_dispatched_retry, "dispatched"), (_reclaimed, "ambiguous"),
    (_replayed, "replayed"),
], ids=["running", "expired_lease", "started_attempt", "reclaimed_attempt", "replayed"])
def test_rollback_is_refused_while_an_item_could_have_dispatched(control_conn, reg, make, kind):
    enqueue(control_conn, reg, items(2, "t"))
    blocker = make(control_conn, reg)
    assert rollback.disable_claims(control_conn, reg, 1, recorded_by="op")
    with pytest.raises(rollback.RollbackRefused, match=f"work item {blocker.work_id} blocks the rollback \\({kind}"):
        rollback.fence(control_conn, reg, 1, recorded_by="op")
    assert "awaiting_legacy_outcome" not in states(control_conn, reg).values()
    status = generations.drain_status(control_conn, reg, 1)
    assert (status.status, status.claim_path) == ("rolling_back", "work_item")
    assert claims.claim_batch(control_conn, owner="w", limit=5, lease_ttl=TTL, registration_ids=[reg]) == []


def test_a_rollback_waits_for_running_items_and_then_fences(control_conn, reg):
    enqueue(control_conn, reg, items(2, "t"))
    running = _claim(control_conn, reg)
    rollback.disable_claims(control_conn, reg, 1, recorded_by="op")
    with pytest.raises(rollback.RollbackRefused, match="running"):
        rollback.fence(control_conn, reg, 1, recorded_by="op")
    assert claims.complete(control_conn, [running.fence]) == {running.work_id}  # its holder still finishes it
    fence = rollback.fence(control_conn, reg, 1, recorded_by="op")
    assert fence.proof["fenced_items"] == 1


def test_a_retry_whose_only_attempt_never_started_is_fenced(control_conn, reg):
    enqueue(control_conn, reg, items(1, "t"))
    item = _claim(control_conn, reg)
    claims.release_unstarted(control_conn, [item.fence])
    fence = roll_back(control_conn, reg)
    assert fence.proof["fenced_items"] == 1
    assert states(control_conn, reg) == {item.work_id: "awaiting_legacy_outcome"}


def test_a_rollback_waits_for_drains_that_started_before_claims_were_disabled(control_conn, reg):
    from nexus_pipelines.workqueue import claimants

    enqueue(control_conn, reg, items(1, "t"))
    claimants.register(control_conn, "old-drain", [reg], TTL)
    claimants.register(control_conn, "other-registration", ["someone-else"], TTL)
    rollback.disable_claims(control_conn, reg, 1, recorded_by="op")
    claimants.register(control_conn, "new-drain", None, TTL)  # started after: it reads the disabled gate
    with pytest.raises(rollback.RollbackRefused, match="first: old-drain"):
        rollback.fence(control_conn, reg, 1, recorded_by="op")
    claimants.deregister(control_conn, "old-drain")
    try:
        assert rollback.fence(control_conn, reg, 1, recorded_by="op").proof["claim_capable_drains"] == 0
    finally:
        for name in ("new-drain", "other-registration"):
            claimants.deregister(control_conn, name)


def test_an_abandoned_rollback_resumes_work_item_claims(control_conn, reg):
    enqueue(control_conn, reg, items(1, "t"))
    rollback.disable_claims(control_conn, reg, 1, recorded_by="op")
    assert claims.claim_batch(control_conn, owner="w", limit=1, lease_ttl=TTL, registration_ids=[reg]) == []
    receipt = generations.activate(control_conn, reg, 1, recorded_by="op", route_versions={"bulk": 1})
    assert receipt.proof["resumed_from"] == "rolling_back"
    assert len(claims.claim_batch(control_conn, owner="w", limit=1, lease_ttl=TTL, registration_ids=[reg])) == 1


def test_recutover_is_refused_while_the_event_path_still_runs(control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(1, "t"))
    roll_back(control_conn, reg)
    with pytest.raises(generations.GenerationGateError, match="active on the event path"):
        generations.activate(control_conn, reg, 1, recorded_by="op", route_versions={"bulk": 1})
    generations.quiesce(control_conn, reg, 1, recorded_by="op")
    with pytest.raises(generations.GenerationGateError, match="still await a terminal legacy outcome"):
        generations.activate(control_conn, reg, 1, recorded_by="op", route_versions={"bulk": 1})
    # the Event path resumes, finishes the fenced item, and the cutover goes through
    generations.activate(control_conn, reg, 1, recorded_by="op", route_versions={"bulk": 1}, claim_path="event")
    event_path.run_event_path(control_dsn, HandlerRegistry({"t": FencedEffects(control_dsn)}), reg, 1)
    recutover(control_conn, reg)


def _refused_cutover(conn, reg) -> str:
    """The re-cutover's refusal (one line); nothing changed: the generation is still Event-owned."""
    with pytest.raises(generations.GenerationGateError) as refused:
        generations.activate(conn, reg, 1, recorded_by="op", route_versions={"bulk": 1})
    assert "\n" not in str(refused.value)
    assert generations.drain_status(conn, reg, 1).claim_path == "event"
    return str(refused.value)


def test_recutover_is_refused_while_the_event_path_scheduler_lease_is_held(control_conn, reg):
    from nexus_pipelines.control import leases

    enqueue(control_conn, reg, items(1, "t"))
    (work_id,) = work_ids(control_conn, reg)
    roll_back(control_conn, reg)
    held = leases.acquire(control_conn, claims.scheduler_lease_name(reg, 1), "event-executor-a", TTL)
    generations.quiesce(control_conn, reg, 1, recorded_by="op")
    line = _refused_cutover(control_conn, reg)
    assert line.startswith(f"generation {reg}@1: the Event path's scheduler lease is still held by "
                           "'event-executor-a' (until ") and line.endswith("UTC); wait for it to stop")
    assert _item(control_conn, work_id)[0] == "awaiting_legacy_outcome"
    assert leases.release(control_conn, held)
    assert "still await a terminal legacy outcome" in _refused_cutover(control_conn, reg)  # the next fact


def test_recutover_is_refused_while_an_event_execution_was_left_started(control_conn, control_dsn, reg):
    from nexus_pipelines.control import leases

    enqueue(control_conn, reg, items(1, "t"))
    (work_id,) = work_ids(control_conn, reg)
    roll_back(control_conn, reg)
    # an executor started the attempt under its lease and went away without recording an outcome
    gone = leases.acquire(control_conn, claims.scheduler_lease_name(reg, 1), "gone", TTL)
    control_conn.execute(
        """UPDATE event_executions SET state = 'started', start_token = %s, started_at = now(),
                  attempts = attempts + 1 WHERE work_id = %s""",
        (gone.token, work_id),
    )
    leases.release(control_conn, gone)
    generations.quiesce(control_conn, reg, 1, recorded_by="op")
    assert _refused_cutover(control_conn, reg) == (
        f"generation {reg}@1: 1 Event executions were left started by a lease holder that is gone; "
        f"run `queue event-drain {reg} 1` to settle them")
    assert control_conn.execute("SELECT state FROM event_executions WHERE work_id = %s", (work_id,)).fetchone() == (
        "started",)
    # what the refusal says to do settles it (a retry: the budget is not spent), and the next fact blocks
    report = event_path.run_event_path(control_dsn, HandlerRegistry({"t": FencedEffects(control_dsn)}), reg, 1)
    assert (report.interrupted, report.stopped) == (1, "not_admitted")
    assert "still await a terminal legacy outcome" in _refused_cutover(control_conn, reg)


@pytest.mark.parametrize("make, measured", [
    (_running, {"running_items": 1, "active_leases": 1, "started_attempts": 1}),
    (_expired, {"running_items": 1, "expired_leases": 1, "started_attempts": 1}),
    (_dispatched_retry, {"started_attempts": 1}),
], ids=["running", "expired_lease", "started_attempt"])
def test_the_fence_proof_is_measured_in_the_fence_transaction(control_conn, reg, make, measured, monkeypatch):
    enqueue(control_conn, reg, items(2, "t"))
    make(control_conn, reg)
    rollback.disable_claims(control_conn, reg, 1, recorded_by="op")
    # were the blockers query to miss the item, the measured proof still refuses the fence
    monkeypatch.setattr(rollback, "_BLOCKERS", "SELECT NULL, NULL, NULL WHERE false")
    with pytest.raises(rollback.RollbackRefused) as refused:
        rollback.fence(control_conn, reg, 1, recorded_by="op")
    assert ", ".join(f"{k}={v}" for k, v in measured.items()) in str(refused.value)
    assert "awaiting_legacy_outcome" not in states(control_conn, reg).values()
    assert generations.drain_status(control_conn, reg, 1).status == "rolling_back"


def test_a_fence_receipt_records_the_counts_it_measured(control_conn, reg):
    enqueue(control_conn, reg, items(2, "t"))
    fence = roll_back(control_conn, reg)
    (stored,) = control_conn.execute("SELECT proof FROM workqueue_generation_receipts WHERE receipt_id = %s",
                                     (fence.receipt_id,)).fetchone()
    assert stored == fence.proof
    assert {k: stored[k] for k in ("running_items", "active_leases", "expired_leases", "started_attempts",
                                   "claim_transactions", "claim_capable_drains", "fenced_items")} == {
        "running_items": 0, "active_leases": 0, "expired_leases": 0, "started_attempts": 0,
        "claim_transactions": 0, "claim_capable_drains": 0, "fenced_items": 2}
