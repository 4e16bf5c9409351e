"""No lock cycle between a claim and a completion, provoked deterministically.

A claim's `FOR UPDATE SKIP LOCKED` keeps a lock on a candidate that another claim took
after this claim's snapshot (PostgreSQL locks the newest version, then rechecks it),
and a claim can wait in a target lane's unique index for the transaction finishing
the lane's running item. Under load that made a completion wait for a claim that
waited for the completion: DeadlockDetected in `complete`, and the drain crashed.
Here each wait is staged with explicit row locks on separate connections.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg

from nexus_pipelines.control.db import connect
from nexus_pipelines.workqueue import claims, worker
from nexus_pipelines.workqueue.handlers import HandlerRegistry
from nexus_pipelines.workqueue.receipts import NewWork

from .conftest import enqueue, items
from .support import take, wait_for_statement_blocked, wait_until_blocked, work_ids

TTL = timedelta(seconds=30)


def _in_thread(fn, out: dict, key: str) -> threading.Thread:
    def target():
        try:
            out[key] = fn()
        except Exception as exc:  # noqa: BLE001 - the test asserts on it
            out[key] = exc
    thread = threading.Thread(target=target)
    thread.start()
    return thread


def _pkey_order(conn) -> None:
    # the plan a completion gets on a big table: fences in work_id order over the primary key
    for setting in ("enable_seqscan", "enable_hashjoin", "enable_mergejoin"):
        conn.execute(f"SET {setting} = off")


def test_a_claim_with_an_old_snapshot_never_deadlocks_a_completion(control_dsn, reg):
    lanes = [NewWork(f"{reg}-{name}", "t", target_lane_key=lane) for name, lane in
             (("x1", "a"), ("y1", "a"), ("x", "b"), ("q", None), ("r", None), ("y", "b"))]
    with connect(control_dsn) as setup:
        enqueue(setup, reg, lanes)
        x1, _y1, x, q, r, _y = work_ids(setup, reg)
    gate, lane_a, drain_a, claimer, row_q, observer = (connect(control_dsn) for _ in range(6))
    _pkey_order(drain_a)
    out: dict = {}
    # The claim takes its snapshot and meets a gate lock on the generation row. It may
    # wait there (then its snapshot will be old when it scans) or give up (then it
    # holds nothing): the rest of the test runs either way.
    gate.execute("BEGIN")
    gate.execute("SELECT 1 FROM workqueue_generations WHERE registration_id = %s FOR UPDATE", (reg,))
    claim = _in_thread(lambda: claims.claim_batch(claimer, owner="B", limit=10, lease_ttl=TTL,
                                                  registration_ids=[reg]), out, "claim")
    claim.join(1.0)
    # meanwhile drain A claims x1, x, q, r, and x1's completion is in progress elsewhere
    tokens = {wid: take(observer, wid, "A") for wid in (x1, x, q, r)}
    row_q.execute("BEGIN")
    row_q.execute("SELECT 1 FROM connector_work_items WHERE work_id = %s FOR UPDATE", (q,))
    lane_a.execute("BEGIN")
    lane_a.execute("UPDATE connector_work_items SET state = 'completed', lease_until = NULL WHERE work_id = %s", (x1,))
    # A completes x, q, r: x is updated, then it waits for q
    complete = _in_thread(lambda: claims.complete(drain_a, [(w, tokens[w]) for w in (x, q, r)]), out, "complete")
    wait_until_blocked(observer, drain_a)
    gate.execute("COMMIT")  # a waiting claim scans: it locks r (taken after its snapshot), waits in lane a
    claim.join(0.5)
    row_q.execute("COMMIT")  # A takes q and would wait for the claim's lock on r
    lane_a.execute("COMMIT")  # a waiting claim would now wait in lane b's index for A: the cycle
    complete.join(30)
    claim.join(30)

    assert out["complete"] == {x, q, r}, out["complete"]
    assert isinstance(out["claim"], claims.LaneRaceLost)  # it backed off and wrote nothing
    states = dict(observer.execute(
        "SELECT work_id, state FROM connector_work_items WHERE registration_id = %s", (reg,)).fetchall())
    assert [states[w] for w in (x1, x, q, r)] == ["completed"] * 4
    assert sorted(s for w, s in states.items() if w not in (x1, x, q, r)) == ["pending", "pending"]


def test_a_claim_waiting_in_a_lane_index_gives_up_instead_of_holding_its_locks(control_dsn, reg):
    with connect(control_dsn) as setup:
        enqueue(setup, reg, [NewWork(f"{reg}-x", "t", target_lane_key="t"), NewWork(f"{reg}-y", "t", target_lane_key="t")])
        x, y = work_ids(setup, reg)
    holder, claimer = connect(control_dsn), connect(control_dsn)
    out: dict = {}
    # another transaction is taking x (lane t) and has not committed: the claim's snapshot
    # sees x pending and locked (skipped), y's lane free, and y's lane key collides with x's
    holder.execute("BEGIN")
    take(holder, x, "holder")
    claim = _in_thread(lambda: claims.claim_batch(claimer, owner="B", limit=10, lease_ttl=TTL,
                                                  registration_ids=[reg]), out, "claim")
    claim.join(10)
    finished_while_held = not claim.is_alive()
    holder.execute("COMMIT")
    claim.join(10)

    assert finished_while_held, "the claim waited for the other transaction instead of giving up"
    assert isinstance(out["claim"], claims.LaneRaceLost)
    with connect(control_dsn) as conn:
        assert conn.execute("SELECT state FROM connector_work_items WHERE work_id = %s", (y,)).fetchone() == ("pending",)


def test_a_drain_retries_a_completion_that_met_a_deadlock_and_loses_no_item(control_dsn, reg, monkeypatch):
    with connect(control_dsn) as setup:
        enqueue(setup, reg, [NewWork(f"{reg}-x", "t", target_lane_key="hot"), NewWork(f"{reg}-r", "t")])
        enqueue(setup, f"{reg}-filler", items(300))  # a table big enough for primary-key plans
        setup.execute("ANALYZE connector_work_items")
        x, r = work_ids(setup, reg)
        # y shares x's target lane, in a revision nobody claims
        enqueue(setup, reg, [NewWork(f"{reg}-y", "t", target_lane_key="hot")], revision=2, activate_it=False)
        (y,) = [w for w in work_ids(setup, reg) if w not in (x, r)]
    other, observer = connect(control_dsn), connect(control_dsn)
    handler_started, go = threading.Event(), threading.Event()

    def handler(item):
        if item.work_id == r:
            handler_started.set()
            go.wait(10)
        return "done"

    # both items finish in one chunk, so one completion statement takes x, then r
    monkeypatch.setattr(worker._ClaimSizer, "chunk", lambda self, claimed: claimed)
    out: dict = {}
    drain = _in_thread(lambda: worker.drain(
        control_dsn, HandlerRegistry({"t": handler}), worker_id="drain-a", registration_ids=[reg],
        claim_batch=2, concurrency=1, time_budget_s=60), out, "report")
    assert handler_started.wait(10)
    other.execute("BEGIN")
    other.execute("SELECT 1 FROM connector_work_items WHERE work_id = %s FOR UPDATE", (r,))
    go.set()
    wait_for_statement_blocked(observer, "SET state = 'completed'")  # it updated x and waits for r
    try:  # y takes lane 'hot' while x's completion is in flight: the completion waits for us, we for it
        other.execute(
            """UPDATE connector_work_items SET state = 'running', lease_owner = 'other', lease_token = -1,
                      lease_until = now() + interval '1 minute' WHERE work_id = %s""", (y,))
    except psycopg.errors.UniqueViolation:
        pass  # the deadlock detector failed the completion, so x still runs and our lane key clashes
    other.execute("ROLLBACK")
    drain.join(60)

    report = out["report"]
    assert not isinstance(report, Exception), report
    assert (report.completed, report.lost) == (2, 0) and report.statement_retries >= 1
    assert observer.execute(
        "SELECT count(*) FROM connector_work_items WHERE work_id = ANY(%s) AND state = 'completed'", ([x, r],)
    ).fetchone() == (2,)
