"""The drain's batch interface: a Batched work type's items reach its handler as batches, one
answer per item; a single-item work type beside it still runs one item at a time."""

from __future__ import annotations

import threading

from nexus_pipelines.workqueue.handlers import Batched, HandlerRegistry, PermanentError
from nexus_pipelines.workqueue.retry import RetryPolicy
from nexus_pipelines.workqueue.worker import drain

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


def test_a_claim_is_split_into_even_batches_without_a_small_remainder():
    from nexus_pipelines.workqueue.worker import _ClaimSizer

    sizer = _ClaimSizer(claim_batch=100, concurrency=2, fast=False, batched=True)
    assert sizer.batch_size(100) == 50  # a full claim: a thread's share each
    assert sizer.batch_size(70) == 70  # not 50 and 20
    assert sizer.batch_size(30) == 30  # a small top-up stays one batch
    assert _ClaimSizer(claim_batch=100, concurrency=4, fast=False, batched=True).batch_size(90) == 30
