"""The drain's batch interface: a Batched work type's items reach its handler as batches, one
answer per item; a single-item work type beside it still runs one item at a time."""

from __future__ import annotations

import threading
from datetime import timedelta

from nexus_pipelines.control.db import connect
from nexus_pipelines.workqueue import claims, event_path, generations
from nexus_pipelines.workqueue.handlers import Batched, HandlerRegistry, PermanentError, complete_with_effects
from nexus_pipelines.workqueue.receipts import enqueue_work_items
from nexus_pipelines.workqueue.retry import RetryPolicy
from nexus_pipelines.workqueue.worker import _HeldLeases, drain

from .conftest import enqueue, items

FAST = RetryPolicy(base_s=0, cap_s=0, jitter=0)


def _outcomes(conn, reg):
    return dict(conn.execute(
        "SELECT state || ':' || coalesce(outcome, ''), count(*) FROM connector_work_items"
        " WHERE registration_id = %s GROUP BY 1", (reg,)).fetchall())


def test_batched_items_reach_their_handler_in_batches_and_each_answer_finalizes_its_own_item(
        control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(200, "observe") + items(3, "close"))
    batches: list[list[int]] = []
    singles: list[int] = []
    lock = threading.Lock()

    def observe(batch):
        with lock:
            batches.append([i.work_id for i in batch])
        # every tenth item fails for good; the others succeed
        return [PermanentError("not mappable") if i.work_id % 10 == 0 else "applied" for i in batch]

    def close(item):
        with lock:
            singles.append(item.work_id)
        return "closed"

    registry = HandlerRegistry({"observe": Batched(observe), "close": close})
    report = drain(control_dsn, registry, registration_ids=[reg], concurrency=2, claim_batch=100,
                   retry_policy=FAST, time_budget_s=60)
    applied = [w for b in batches for w in b]
    assert sorted(applied) == sorted(set(applied)) and len(applied) == 200  # each item once
    assert max(len(b) for b in batches) > 1 and all(b == sorted(b) for b in batches)  # claim order kept
    assert len(singles) == 3
    dead = sum(1 for w in applied if w % 10 == 0)
    assert _outcomes(control_conn, reg) == {"completed:applied": 200 - dead, "completed:closed": 3, "dead:dead": dead}
    assert (report.completed, report.dead, report.lost) == (203 - dead, dead, 0)


def test_a_batch_that_fails_as_a_whole_retries_every_item_of_it(control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(20, "observe", max_attempts=2))
    calls = []

    def broken(batch):
        calls.append(len(batch))
        raise RuntimeError("the batch transaction failed")

    report = drain(control_dsn, HandlerRegistry({"observe": Batched(broken)}), registration_ids=[reg],
                   concurrency=2, claim_batch=100, retry_policy=FAST, time_budget_s=60)
    assert sum(calls) == 40 and report.dead == 20 and report.retried == 20 and report.completed == 0


def _completing(control_dsn, fail_first_attempts: bool = False):
    """A batch handler that completes its held items in its own transaction and records that
    transaction's id; with `fail_first_attempts` a batch of first attempts fails after the completion."""
    xids: list[int] = []
    failed: set[int] = set()

    def observe(batch):
        with connect(control_dsn) as conn, conn.transaction():
            held = claims.lock_fences(conn, batch)
            assert len(held) == len(batch)
            xids.append(conn.execute("SELECT txid_current() % 4294967296").fetchone()[0])
            answers = complete_with_effects(conn, batch, ["applied"] * len(batch))
            if fail_first_attempts and all(i.attempts == 1 for i in batch):
                failed.update(i.work_id for i in batch)
                raise RuntimeError("the effect transaction failed after the completion")
        return answers

    return observe, xids, failed


def test_a_batch_handler_completes_its_items_in_its_own_transaction_and_the_drain_only_counts_them(
        control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(60, "observe"))
    observe, xids, _ = _completing(control_dsn)
    report = drain(control_dsn, HandlerRegistry({"observe": Batched(observe)}), registration_ids=[reg],
                   concurrency=2, claim_batch=30, retry_policy=FAST, time_budget_s=60)
    rows = control_conn.execute(
        "SELECT state, outcome, xmin::text::bigint FROM connector_work_items WHERE registration_id = %s",
        (reg,)).fetchall()
    assert {(state, outcome) for state, outcome, _ in rows} == {("completed", "applied")}
    assert {xmin for _, _, xmin in rows} <= set(xids)  # last written by the handlers' own transactions
    assert (report.completed, report.lost, report.retried) == (60, 0, 0)


def test_a_batch_whose_effect_transaction_fails_after_completing_leaves_its_items_to_the_retry_path(
        control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(20, "observe", max_attempts=2))
    observe, _, failed = _completing(control_dsn, fail_first_attempts=True)
    report = drain(control_dsn, HandlerRegistry({"observe": Batched(observe)}), registration_ids=[reg],
                   concurrency=1, claim_batch=20, retry_policy=FAST, time_budget_s=60)
    assert failed and _outcomes(control_conn, reg) == {"completed:applied": 20}
    assert (report.completed, report.retried, report.lost) == (20, len(failed), 0)
    retried = {r[0] for r in control_conn.execute(
        "SELECT work_id FROM connector_work_items WHERE registration_id = %s AND attempts = 2", (reg,))}
    assert retried == failed


def test_on_the_event_path_a_batch_handler_completes_nothing_itself_and_the_executor_settles_its_items(
        control_conn, control_dsn, reg):
    generations.activate(control_conn, reg, 1, recorded_by="test", route_versions={"bulk": 1}, claim_path="event")
    enqueue_work_items(control_conn, items(3, "observe"), registration_id=reg, revision=1)
    answers: list = []

    def observe(batch):
        with connect(control_dsn) as conn, conn.transaction():
            assert len(claims.lock_fences(conn, batch)) == len(batch)
            answers.extend(complete_with_effects(conn, batch, ["applied"] * len(batch)))
        return answers[-len(batch):]

    report = event_path.run_event_path(control_dsn, HandlerRegistry({"observe": Batched(observe)}), reg, 1,
                                       retry_policy=FAST, time_budget_s=60)
    assert answers == ["applied"] * 3 and report.completed == 3
    assert control_conn.execute(
        "SELECT count(*) FROM legacy_outcome_receipts WHERE registration_id = %s AND outcome = 'succeeded'", (reg,)
    ).fetchone() == (3,)


def test_a_heartbeat_after_a_batch_completed_its_items_with_their_effects_reports_none_of_them_lost(
        control_conn, reg):
    enqueue(control_conn, reg, items(2, "observe"))
    completed, taken = sorted(claims.claim_batch(control_conn, owner="me", limit=2, lease_ttl=timedelta(seconds=30),
                                                 registration_ids=[reg]), key=lambda i: i.work_id)
    leases = _HeldLeases(timedelta(seconds=30))
    leases.hold([completed, taken])
    assert claims.complete(control_conn, [completed.fence], outcome="applied")  # as its batch handler does
    control_conn.execute("UPDATE connector_work_items SET lease_token = nextval('workqueue_tokens')"
                         " WHERE work_id = %s", (taken.work_id,))  # taken over by another holder
    leases.beat(control_conn)
    assert not completed.lease_lost.is_set() and completed.fence not in leases.lost
    assert taken.lease_lost.is_set() and taken.fence in leases.lost


def test_a_claim_is_split_into_even_batches_without_a_small_remainder():
    from nexus_pipelines.workqueue.worker import _ClaimSizer

    sizer = _ClaimSizer(claim_batch=100, concurrency=2, fast=False, batched=True)
    assert sizer.batch_size(100) == 50  # a full claim: a thread's share each
    assert sizer.batch_size(70) == 70  # not 50 and 20
    assert sizer.batch_size(30) == 30  # a small top-up stays one batch
    assert _ClaimSizer(claim_batch=100, concurrency=4, fast=False, batched=True).batch_size(90) == 30
