"""The database itself refuses a second claim path for a generation (0017), whatever SQL runs."""

from __future__ import annotations

import psycopg
import pytest

from nexus_pipelines.workqueue import generations, legacy_outcomes
from nexus_pipelines.workqueue.receipts import NewWork, enqueue_work_items

from .conftest import enqueue, items
from .support import roll_back, work_ids

Refused = psycopg.errors.IntegrityConstraintViolation


def test_a_generation_with_claimable_work_items_cannot_become_event_owned(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    with pytest.raises(Refused, match="cannot be Event-owned"):
        control_conn.execute(
            "UPDATE workqueue_generations SET claim_path = 'event' WHERE registration_id = %s", (reg,))


def test_an_event_owned_generation_gets_no_claimable_work_item(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    (work_id,) = work_ids(control_conn, reg)
    roll_back(control_conn, reg)
    with pytest.raises(Refused):  # a fenced item is never made claimable again
        control_conn.execute("UPDATE connector_work_items SET state = 'pending' WHERE work_id = %s", (work_id,))
    with pytest.raises(Refused, match="Event-owned"):
        control_conn.execute(
            """INSERT INTO connector_work_items (event_id, registration_id, revision, work_type)
               SELECT event_id, registration_id, revision, 'another' FROM connector_work_items WHERE work_id = %s""",
            (work_id,),
        )
    # the router gives new work of an Event-owned generation to the Event path
    assert enqueue_work_items(control_conn, [NewWork(f"{reg}-late", "t")], registration_id=reg, revision=1) == 1
    assert control_conn.execute(
        "SELECT count(*) FROM event_executions WHERE registration_id = %s AND rollback_fence_id IS NULL", (reg,)
    ).fetchone() == (1,)


def test_a_work_item_owned_generation_starts_no_event_execution(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    (work_id,) = work_ids(control_conn, reg)
    roll_back(control_conn, reg)
    generations.quiesce(control_conn, reg, 1, recorded_by="op")  # the Event path no longer admits starts
    with pytest.raises(Refused, match="cannot start"):
        control_conn.execute(
            "UPDATE event_executions SET state = 'started', start_token = 1, started_at = now() WHERE work_id = %s",
            (work_id,),
        )
    with pytest.raises(Refused, match="needs an Event-owned generation"):
        control_conn.execute(
            """INSERT INTO event_executions (event_id, work_type, registration_id, revision)
               SELECT event_id, 'x', %s, 7 FROM connector_work_items WHERE work_id = %s""",
            (reg, work_id),
        )


def test_a_generation_with_unfinished_event_work_cannot_become_work_item_owned(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    roll_back(control_conn, reg)
    with pytest.raises(Refused, match="cannot be WorkItem-owned"):
        control_conn.execute(
            "UPDATE workqueue_generations SET claim_path = 'work_item' WHERE registration_id = %s", (reg,))


def test_a_terminal_event_outcome_commits_only_with_its_receipt(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    (work_id,) = work_ids(control_conn, reg)
    roll_back(control_conn, reg)
    with pytest.raises(Refused, match="without a LegacyOutcomeReceipt"), control_conn.transaction():
        control_conn.execute("UPDATE event_executions SET state = 'succeeded' WHERE work_id = %s", (work_id,))
    assert control_conn.execute("SELECT state FROM event_executions WHERE work_id = %s", (work_id,)).fetchone() == (
        "pending",)


def test_an_awaiting_item_is_reconciled_only_from_the_latest_terminal_receipt_of_its_fence(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    (work_id,) = work_ids(control_conn, reg)
    fence = roll_back(control_conn, reg)
    reconcile = ("UPDATE connector_work_items SET state = 'reconciled_legacy_terminal', "
                 "legacy_outcome_receipt_version = %s, legacy_outcome_digest = %s WHERE work_id = %s")
    with pytest.raises(Refused, match="only the latest terminal LegacyOutcomeReceipt"):
        control_conn.execute(reconcile, (1, "sha256:forged", work_id))
    event_id, work_type = control_conn.execute(
        "SELECT event_id, work_type FROM event_executions WHERE work_id = %s", (work_id,)).fetchone()
    execution = legacy_outcomes.Execution(work_id, event_id, work_type, reg, 1, fence.receipt_id)
    with control_conn.transaction():  # an unknown outcome is no reconciliation
        control_conn.execute("UPDATE event_executions SET state = 'unknown' WHERE work_id = %s", (work_id,))
        unknown = legacy_outcomes.record(control_conn, execution, "unknown", token=1, detail={}, recorded_by="t")
    with pytest.raises(Refused):
        control_conn.execute(reconcile, (unknown.version, unknown.digest, work_id))
    assert legacy_outcomes.project(control_conn, reg, 1) == 0


def test_legacy_outcome_receipts_are_immutable(control_conn, control_dsn, reg):
    from nexus_pipelines.workqueue import event_path
    from nexus_pipelines.workqueue.handlers import HandlerRegistry

    enqueue(control_conn, reg, items(1))
    roll_back(control_conn, reg)
    event_path.run_event_path(control_dsn, HandlerRegistry({"t": lambda item: "ok"}), reg, 1)
    for statement in ("UPDATE legacy_outcome_receipts SET outcome = 'failed' WHERE registration_id = %(reg)s",
                      "DELETE FROM legacy_outcome_receipts WHERE registration_id = %(reg)s",
                      "DELETE FROM event_executions WHERE registration_id = %(reg)s"):
        with pytest.raises(Refused):
            control_conn.execute(statement, {"reg": reg})


def test_a_transferred_execution_comes_back_only_under_the_fence_of_its_work_item(control_conn, control_dsn, reg):
    from nexus_pipelines.workqueue import event_path
    from nexus_pipelines.workqueue.handlers import HandlerRegistry

    from .support import recutover

    enqueue(control_conn, reg, items(1))
    fence = roll_back(control_conn, reg)
    event_path.run_event_path(control_dsn, HandlerRegistry({"t": lambda item: "ok"}), reg, 1)
    enqueue_work_items(control_conn, items(1), registration_id=reg, revision=1)
    (late,) = control_conn.execute(
        "SELECT work_id FROM event_executions WHERE registration_id = %s AND rollback_fence_id IS NULL", (reg,)
    ).fetchone()
    recutover(control_conn, reg)  # its execution is 'transferred', its work item pending
    rearm = "UPDATE event_executions SET state = 'pending', rollback_fence_id = %s WHERE work_id = %s"
    for fence_id in (None, fence.receipt_id):  # no fence, or a fence that did not fence its work item
        with pytest.raises(Refused, match="is transferred"):
            control_conn.execute(rearm, (fence_id, late))
    with pytest.raises(Refused, match="transferred and final"):
        control_conn.execute("UPDATE event_executions SET state = 'started', start_token = 1, started_at = now()"
                             " WHERE work_id = %s", (late,))
    assert control_conn.execute("SELECT state FROM event_executions WHERE work_id = %s", (late,)).fetchone() == (
        "transferred",)
