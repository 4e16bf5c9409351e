from __future__ import annotations

import math
from datetime import timedelta

import psycopg
import pytest

from nexus_pipelines.workqueue import claims
from nexus_pipelines.workqueue.claims import Failure
from nexus_pipelines.workqueue.receipts import NewWork, enqueue_work_items
from nexus_pipelines.workqueue.retry import RetryPolicy

from .conftest import enqueue, expire_leases, items, state_of
from .support import claim_plan, cte_plan, plan_nodes, work_item_rows_read

TTL = timedelta(seconds=30)


def claim(conn, reg, n=100, owner="w1", ttl=TTL, **kw):
    return claims.claim_batch(conn, owner=owner, limit=n, lease_ttl=ttl, registration_ids=[reg], **kw)


def test_batch_claim_gives_tokens_owner_and_db_lease(control_conn, reg):
    enqueue(control_conn, reg, items(5))
    got = claim(control_conn, reg, 3)
    assert len(got) == 3
    assert all(i.lease_owner == "w1" and i.attempts == 1 for i in got)
    tokens = [i.token for i in got]
    assert len(set(tokens)) == 3
    (db_now,) = control_conn.execute("SELECT now()").fetchone()
    assert all(timedelta(seconds=25) < i.lease_until - db_now <= TTL for i in got)
    rest = claim(control_conn, reg, 10, owner="w2")
    assert len(rest) == 2 and min(i.token for i in rest) > max(tokens)
    assert claim(control_conn, reg, 10) == []


def test_tokens_strictly_increase_across_reclaims(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    seen = []
    for _ in range(3):
        (item,) = claim(control_conn, reg, ttl=timedelta(seconds=30))
        seen.append(item.token)
        expire_leases(control_conn, reg)
        claims.reclaim_expired(control_conn, policy=RetryPolicy(base_s=0, cap_s=0))
    assert seen == sorted(seen) and len(set(seen)) == 3


def test_finalizers_are_fenced_by_token(control_conn, reg):
    enqueue(control_conn, reg, items(2))
    a, b = claim(control_conn, reg, 2)
    forged = (a.work_id, a.token + 1000)
    assert claims.renew(control_conn, [forged], TTL) == set()
    assert claims.complete(control_conn, [forged]) == set()
    assert claims.finalize_failures(control_conn, [Failure(a.work_id, a.token - 1, "x", "y")]) == {}
    assert claims.renew(control_conn, [a.fence, b.fence], TTL) == {a.work_id, b.work_id}
    assert claims.complete(control_conn, [a.fence]) == {a.work_id}
    assert claims.complete(control_conn, [a.fence]) == set()  # already completed: nothing twice
    assert claims.retry(control_conn, b, "Boom", "failed", policy=RetryPolicy(base_s=10, cap_s=10)) == "retry"
    assert state_of(control_conn, b.work_id)[0] == "retry"
    assert claim(control_conn, reg) == []  # backoff: not due yet


def test_paused_holder_after_expiry_and_reclaim_cannot_renew_or_complete(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    (stale,) = claim(control_conn, reg, owner="paused", ttl=timedelta(milliseconds=200))
    # the holder "pauses"; its lease expires by the database clock
    control_conn.execute("SELECT pg_sleep(0.3)")
    assert claims.complete(control_conn, [stale.fence]) == set()  # expired: rejected even before reclaim
    rec = claims.reclaim_expired(control_conn, policy=RetryPolicy(base_s=0, cap_s=0))
    assert rec.retried >= 1
    (fresh,) = claim(control_conn, reg, owner="other")
    assert fresh.work_id == stale.work_id and fresh.token > stale.token and fresh.attempts == 2
    # the paused holder wakes up
    assert claims.renew(control_conn, [stale.fence], TTL) == set()
    assert claims.complete(control_conn, [stale.fence]) == set()
    assert claims.fail(control_conn, stale, "x", "y") is False
    assert claims.complete(control_conn, [fresh.fence]) == {fresh.work_id}
    assert state_of(control_conn, fresh.work_id)[:3] == ("completed", 2, fresh.token)


def test_reclaim_counts_attempts_and_poison_item_reaches_dead(control_conn, reg):
    enqueue(control_conn, reg, items(1, max_attempts=3))
    for attempt in range(1, 4):
        (item,) = claim(control_conn, reg)
        assert item.attempts == attempt
        expire_leases(control_conn, reg)
        claims.reclaim_expired(control_conn, policy=RetryPolicy(base_s=0, cap_s=0))
    state, attempts, _, reclaims = state_of(control_conn, item.work_id)
    assert (state, attempts, reclaims) == ("dead", 3, 3)
    assert claim(control_conn, reg) == []
    (fclass, summary) = control_conn.execute(
        "SELECT failure_class, failure_summary FROM connector_work_items WHERE work_id = %s", (item.work_id,)
    ).fetchone()
    assert fclass == "lease_expired" and "attempt 3 of 3" in summary


def test_failures_retry_with_backoff_then_dead_at_max_attempts(control_conn, reg):
    enqueue(control_conn, reg, items(1, max_attempts=2))
    (item,) = claim(control_conn, reg)
    assert claims.finalize_failures(control_conn, [Failure(item.work_id, item.token, "E", "s", delay_s=0)]) == {
        item.work_id: "retry"
    }
    (item,) = claim(control_conn, reg)
    assert claims.finalize_failures(control_conn, [Failure(item.work_id, item.token, "E", "s", delay_s=0)]) == {
        item.work_id: "dead"
    }


def test_permanent_failure_is_dead_at_once_and_summary_is_sanitized(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    (item,) = claim(control_conn, reg)
    secret = "password=hunter2 Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123456789 " + "x" * 2000
    assert claims.fail(control_conn, item, "Rejected", secret)
    (summary,) = control_conn.execute(
        "SELECT failure_summary FROM connector_work_items WHERE work_id = %s", (item.work_id,)
    ).fetchone()
    assert "hunter2" not in summary and "abcdefghijklmnop" not in summary and len(summary) <= 500


# --- lanes ---------------------------------------------------------------------------------


def test_source_lane_only_head_is_claimable(control_conn, reg):
    enqueue(control_conn, reg, items(3, source_lane_key="lane-a") + items(1, source_lane_key="lane-b"))
    got = claim(control_conn, reg, 10)
    assert sorted(i.source_lane_key for i in got) == ["lane-a", "lane-b"]
    head_a = next(i for i in got if i.source_lane_key == "lane-a")
    claims.complete(control_conn, [head_a.fence])
    (nxt,) = claim(control_conn, reg, 10)
    assert nxt.source_lane_key == "lane-a" and nxt.work_id > head_a.work_id


def test_target_lane_serializes_in_flight_items(control_conn, reg):
    enqueue(control_conn, reg, [NewWork(f"t{i}-{reg}", "t", source_lane_key=f"s{i}", target_lane_key="hot") for i in range(3)])
    got = claim(control_conn, reg, 10)
    assert len(got) == 1
    assert claim(control_conn, reg, 10) == []
    claims.complete(control_conn, [got[0].fence])
    assert len(claim(control_conn, reg, 10)) == 1


def _claim_wrote(conn, reg) -> tuple[list, bool]:
    """A claim in a transaction of its own, and whether it wrote anything (a write,
    a row lock included, gives the transaction an id and a commit record)."""
    with conn.transaction():
        got = claim(conn, reg, 10)
        (xid,) = conn.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()
    return got, xid is not None


def test_a_claim_that_takes_nothing_writes_nothing(control_conn, reg):
    assert _claim_wrote(control_conn, reg) == ([], False)  # nothing enqueued
    enqueue(control_conn, reg, items(2, source_lane_key="lane-a"))
    head, wrote = _claim_wrote(control_conn, reg)
    assert len(head) == 1 and wrote
    # the lane's next item waits for its running head: due, but nothing to take
    assert _claim_wrote(control_conn, reg) == ([], False)
    claims.complete(control_conn, [head[0].fence])
    nxt, wrote = _claim_wrote(control_conn, reg)
    assert len(nxt) == 1 and wrote


def test_a_claim_holds_no_row_lock_on_candidates_it_did_not_take(control_conn, control_dsn, reg):
    """A claim holds its candidates with advisory locks: rows it passed over stay free to
    lock and update for everyone else while its transaction is open."""
    from nexus_pipelines.control.db import connect

    enqueue(control_conn, reg, [NewWork(f"c{i}-{reg}", "t", source_lane_key=f"s{i}", target_lane_key="one")
                                for i in range(3)])
    with connect(control_dsn) as other, control_conn.transaction():
        (taken,) = claim(control_conn, reg, 10)  # one per target lane; the other two were candidates
        assert claim(other, reg, 10) == []  # the open claim still holds its candidates
        passed_over = [w for (w,) in other.execute(
            "SELECT work_id FROM connector_work_items WHERE registration_id = %s AND work_id <> %s", (reg, taken.work_id))]
        assert len(passed_over) == 2
        for work_id in passed_over:
            other.execute("SET lock_timeout = '100ms'")
            assert other.execute("SELECT 1 FROM connector_work_items WHERE work_id = %s FOR UPDATE NOWAIT",
                                 (work_id,)).fetchone() == (1,)
    assert state_of(control_conn, taken.work_id)[0] == "running"


def test_a_claim_locks_no_candidate_its_lane_probes_rejected(control_conn, reg):
    """Items of a busy target lane are passed over without a candidate lock (parking one
    takes none either), so a hot lane's backlog costs a claim no lock-table entries."""
    enqueue(control_conn, reg, [NewWork(f"h{i}-{reg}", "t", source_lane_key=f"s{i}", target_lane_key="hot")
                                for i in range(50)])
    assert len(claim(control_conn, reg, 10)) == 1  # the hot lane is now busy
    while isinstance(got := claim(control_conn, reg, 10), claims.LaneRaceLost):  # parking, 10 per claim
        pass
    assert got == []
    with control_conn.transaction():
        assert claim(control_conn, reg, 10) == []
        (held,) = control_conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").fetchone()
    assert held == 0


def test_database_enforces_one_running_item_per_lane(control_conn, reg):
    enqueue(control_conn, reg, [NewWork(f"u{i}-{reg}", "t", target_lane_key="tgt", source_lane_key=f"s{i}") for i in range(2)])
    enqueue(control_conn, reg, [NewWork(f"v{i}-{reg}", "t", source_lane_key="src") for i in range(2)], activate_it=False)
    for lane_col, key in (("target_lane_key", "tgt"), ("source_lane_key", "src")):
        with pytest.raises(psycopg.errors.UniqueViolation):
            control_conn.execute(
                f"UPDATE connector_work_items SET state = 'running', lease_owner = 'x', lease_token = 1,"
                f" lease_until = now() + interval '1 minute' WHERE registration_id = %s AND {lane_col} = %s",
                (reg, key),
            )


def test_retry_waiting_item_holds_its_source_lane_but_not_its_target_lane(control_conn, reg):
    """The documented lane decision (claims.py)."""
    enqueue(
        control_conn,
        reg,
        [
            NewWork(f"a1-{reg}", "t", source_lane_key="A", target_lane_key="T"),
            NewWork(f"a2-{reg}", "t", source_lane_key="A"),
            NewWork(f"b1-{reg}", "t", source_lane_key="B", target_lane_key="T"),
        ],
    )
    first = claim(control_conn, reg, 10)
    a1 = next(i for i in first if i.source_lane_key == "A")
    assert a1.target_lane_key == "T" and {i.source_lane_key for i in first} == {"A"}  # b1 waits on target T
    claims.finalize_failures(control_conn, [Failure(a1.work_id, a1.token, "E", "s", delay_s=3600)])
    # a1 waits to retry: lane A stays blocked (a2 is not claimable) but target T is free for b1
    got = claim(control_conn, reg, 10)
    assert [i.source_lane_key for i in got] == ["B"]


def test_dead_lettering_releases_lanes(control_conn, reg):
    enqueue(
        control_conn,
        reg,
        [NewWork(f"d1-{reg}", "t", source_lane_key="A", target_lane_key="T"), NewWork(f"d2-{reg}", "t", source_lane_key="A", target_lane_key="T")],
    )
    (first,) = claim(control_conn, reg, 10)
    assert claims.fail(control_conn, first, "Rejected", "no")
    (second,) = claim(control_conn, reg, 10)
    assert second.work_id > first.work_id


def test_items_without_lanes_do_not_participate(control_conn, reg):
    enqueue(control_conn, reg, items(5))
    assert len(claim(control_conn, reg, 10)) == 5


def test_only_registered_work_types_and_queue_classes_are_claimed(control_conn, reg):
    enqueue(control_conn, reg, items(2, "a") + items(2, "b", queue_class="bulk"))
    assert {i.work_type for i in claim(control_conn, reg, 10, work_types=["a"])} == {"a"}
    got = claim(control_conn, reg, 10, queue_classes=["bulk"])
    assert {(i.work_type, i.queue_class) for i in got} == {("b", "bulk")}


def test_claim_returns_event_payload(control_conn, reg):
    enqueue(control_conn, reg, [NewWork(f"p-{reg}", "t", payload={"n": 7})])
    (item,) = claim(control_conn, reg)
    assert item.payload == {"n": 7}


def test_enqueue_is_idempotent_per_event_and_work_type(control_conn, reg):
    batch = items(3)
    assert enqueue_work_items(control_conn, batch, registration_id=reg, revision=1) == 3
    assert enqueue_work_items(control_conn, batch, registration_id=reg, revision=1) == 0
    (count,) = control_conn.execute("SELECT count(*) FROM connector_work_items WHERE registration_id = %s", (reg,)).fetchone()
    assert count == 3


def test_events_are_immutable(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    with pytest.raises(psycopg.errors.IntegrityConstraintViolation):
        control_conn.execute("UPDATE connector_outbox_events SET source_id = 'x' WHERE registration_id = %s", (reg,))


def test_unique_event_work_type(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    with pytest.raises(psycopg.errors.UniqueViolation):
        control_conn.execute(
            "INSERT INTO connector_work_items (event_id, registration_id, revision, work_type)"
            " SELECT event_id, registration_id, revision, work_type FROM connector_work_items WHERE registration_id = %s",
            (reg,),
        )


def test_lock_fence_holds_only_for_the_current_token_and_blocks_a_reclaim(control_conn, control_dsn, reg):
    from nexus_pipelines.control.db import connect

    enqueue(control_conn, reg, items(1))
    (item,) = claims.claim_batch(control_conn, owner="w", limit=1, lease_ttl=timedelta(seconds=30), registration_ids=[reg])
    with connect(control_dsn) as handler_conn, handler_conn.transaction():
        assert claims.lock_fence(handler_conn, item)
        with connect(control_dsn) as other:
            other.execute("SET lock_timeout = '200ms'")
            try:
                other.execute("UPDATE connector_work_items SET lease_until = now() WHERE work_id = %s", (item.work_id,))
                blocked = False
            except Exception:  # noqa: BLE001 - LockNotAvailable
                blocked = True
        assert blocked
    stale = type(item)(**{**{f: getattr(item, f) for f in item.__dataclass_fields__}, "token": item.token - 1})
    with control_conn.transaction():
        assert not claims.lock_fence(control_conn, stale)


# --- reclaim backoff and the dispatch record ---------------------------------------------


def test_reclaim_waits_the_retry_policy_delay(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    (item,) = claim(control_conn, reg)
    expire_leases(control_conn, reg)
    assert claims.reclaim_expired(control_conn, policy=RetryPolicy(base_s=40, cap_s=40, jitter=0)).retried == 1
    (wait_s,) = control_conn.execute(
        "SELECT extract(epoch FROM run_after - now()) FROM connector_work_items WHERE work_id = %s", (item.work_id,)
    ).fetchone()
    assert 35 < wait_s <= 40


def test_reclaim_of_an_item_with_a_huge_attempt_count_waits_the_cap(control_conn, reg):
    # the SQL formula it replaced computed power(2, attempts - 1) without a cap on the exponent
    enqueue(control_conn, reg, items(1, max_attempts=100_000))
    (item,) = claim(control_conn, reg)
    control_conn.execute("UPDATE connector_work_items SET attempts = 5000 WHERE work_id = %s", (item.work_id,))
    expire_leases(control_conn, reg)
    assert claims.reclaim_expired(control_conn, policy=RetryPolicy(base_s=1, cap_s=30, jitter=0)).retried == 1
    (wait_s,) = control_conn.execute(
        "SELECT extract(epoch FROM run_after - now()) FROM connector_work_items WHERE work_id = %s", (item.work_id,)
    ).fetchone()
    assert 25 < wait_s <= 30


def test_an_attempt_handed_back_unstarted_does_not_spend_the_budget(control_conn, reg):
    enqueue(control_conn, reg, items(1, max_attempts=1))
    (item,) = claim(control_conn, reg)
    assert claims.release_unstarted(control_conn, [item.fence]) == {item.work_id}
    assert claims.release_unstarted(control_conn, [item.fence]) == set()  # once per attempt
    state, attempts, unstarted = control_conn.execute(
        "SELECT state, attempts, unstarted_attempts FROM connector_work_items WHERE work_id = %s", (item.work_id,)
    ).fetchone()
    assert (state, attempts, unstarted) == ("retry", 1, 1)
    (again,) = claim(control_conn, reg)  # due at once, and its one dispatch is still to come
    assert claims.retry(control_conn, again, "E", "failed", policy=RetryPolicy(base_s=0, cap_s=0)) == "dead"


def test_an_item_reclaimed_before_its_holder_started_it_is_recorded_unstarted(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    (item,) = claim(control_conn, reg)
    expire_leases(control_conn, reg)
    claims.reclaim_expired(control_conn, policy=RetryPolicy(base_s=0, cap_s=0))
    assert claims.release_unstarted(control_conn, [item.fence]) == {item.work_id}
    assert control_conn.execute(
        "SELECT state, attempts, unstarted_attempts FROM connector_work_items WHERE work_id = %s", (item.work_id,)
    ).fetchone() == ("retry", 1, 1)


# --- claim cost ----------------------------------------------------------------------------


def test_claim_cost_does_not_follow_due_items_the_statistics_missed(own_conn, reg):
    """Statistics taken while every item was finished (a queue between bursts) must not
    let the claim's compare-and-swap walk every due item: it looks up its picks by key."""
    with own_conn.transaction():
        enqueue(own_conn, reg, [NewWork(f"old{i}-{reg}", "t", source_lane_key=f"o{i}", target_lane_key=f"o{i}")
                                    for i in range(2000)])
        own_conn.execute("UPDATE connector_work_items SET state = 'completed', finished_at = now()"
                             " WHERE registration_id = %s", (reg,))
        own_conn.execute("ANALYZE connector_work_items")
        enqueue(own_conn, reg, [NewWork(f"new{i}-{reg}", "t", source_lane_key=f"n{i}", target_lane_key=f"n{i}")
                                    for i in range(2000)])
        # due by the transaction's clock (now() is its start)
        own_conn.execute("UPDATE connector_work_items SET run_after = now() WHERE registration_id = %s"
                             " AND state = 'pending'", (reg,))
        plan = claim_plan(own_conn, reg, 10)
        assert plan["Actual Rows"] == 10 and work_item_rows_read(plan) <= 100, plan
        raise psycopg.Rollback()


def test_a_claim_walks_its_due_items_in_order_on_an_analyzed_full_queue(own_conn, reg):
    """A full queue whose statistics know it (a backlog of many lanes, a few items each,
    analyzed): the walk reads the due index in claim order up to what it takes, instead of
    reading and sorting every due item (which a planner estimate of how few items are
    source lane heads made look cheaper)."""
    with own_conn.transaction():
        enqueue(own_conn, reg, [NewWork(f"k{i}-{reg}", "t", source_lane_key=f"s{i % 200}",
                                            target_lane_key=f"t{(7 * (i % 200) + i // 200) % 200}")
                                    for i in range(4000)])
        # due by the transaction's clock (now() is its start)
        own_conn.execute("UPDATE connector_work_items SET run_after = now() WHERE registration_id = %s", (reg,))
        own_conn.execute("ANALYZE connector_work_items")
        plan = claim_plan(own_conn, reg, 100, seqscan=True)
        assert plan["Actual Rows"] == 100 and work_item_rows_read(plan) <= 1000, work_item_rows_read(plan)
        raise psycopg.Rollback()


def test_a_large_claim_holds_at_most_the_lock_cap(control_conn, reg):
    """A claim of 1,000 used to hold two advisory locks per item (candidate and target lane):
    its locks are capped, and the items past the cap are left for the next claim."""
    enqueue(control_conn, reg, [NewWork(f"L{i}-{reg}", "t", target_lane_key=f"t{i}") for i in range(600)])
    with control_conn.transaction():
        first = claim(control_conn, reg, 1000)
        (held,) = control_conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").fetchone()
    assert held <= claims.CLAIM_MAX_LOCKS and len(first) >= claims.CLAIM_MAX_LOCKS // 3
    rest = claim(control_conn, reg, 1000) + claim(control_conn, reg, 1000) + claim(control_conn, reg, 1000)
    assert len(rest) == 600 - len(first)


def test_a_hot_target_lane_backlog_is_not_walked_by_every_claim(own_conn, reg):
    """The backlog of a busy target lane sits at the front of the claim order; claims park
    it once instead of walking it each time, and the lane's items still run, in order, one
    at a time."""
    hot = [NewWork(f"hot{i}-{reg}", "t", source_lane_key=f"h{i}", target_lane_key="hot") for i in range(300)]
    enqueue(own_conn, reg, hot + [NewWork(f"o{i}-{reg}", "t", source_lane_key=f"o{i}") for i in range(20)])
    (first,) = claim(own_conn, reg, 1)  # the hot lane is busy from now on
    others = []
    for _ in range(40):
        others += claim(own_conn, reg, 10)
    assert sorted(i.source_lane_key for i in others) == sorted(f"o{i}" for i in range(20))
    enqueue(own_conn, reg, [NewWork(f"late{i}-{reg}", "t", source_lane_key=f"l{i}") for i in range(5)])
    own_conn.execute("ANALYZE connector_work_items")
    with own_conn.transaction():
        plan = claim_plan(own_conn, reg, 10)
        assert plan["Actual Rows"] == 5 and work_item_rows_read(plan) <= 60, plan
        raise psycopg.Rollback()
    hot_ids = sorted(w for (w,) in own_conn.execute(
        "SELECT work_id FROM connector_work_items WHERE registration_id = %s AND target_lane_key = 'hot'", (reg,)))
    assert first.work_id == hot_ids[0]
    ran = [first]
    while len(ran) < 4:
        claims.complete(own_conn, [ran[-1].fence])
        got = [i for i in claim(own_conn, reg, 10) if i.target_lane_key == "hot"]
        assert len(got) == 1
        ran += got
    assert [i.work_id for i in ran] == hot_ids[:4]


def _statement_runs(conn, like: str) -> int:
    """How often this session ran its prepared claim statement whose text is LIKE `like`."""
    (runs,) = conn.execute(
        "SELECT coalesce(sum(generic_plans + custom_plans), 0) FROM pg_prepared_statements"
        " WHERE statement LIKE %s", (like,)).fetchone()
    return runs


def test_a_claim_takes_a_parked_lanes_next_item_in_its_one_statement(control_conn, control_dsn, reg):
    """Claims while a parked lane runs an item, and the claim that takes its next item once it
    runs nothing, are each the one claim statement: no second one to ask the parked lanes."""
    from nexus_pipelines.control.db import connect

    hot = [NewWork(f"hot{i}-{reg}", "t", source_lane_key=f"h{i}", target_lane_key="hot") for i in range(50)]
    enqueue(control_conn, reg, hot + [NewWork(f"o{i}-{reg}", "t", source_lane_key=f"o{i}") for i in range(30)])
    (first,) = claim(control_conn, reg, 1)  # the hot lane is busy from now on
    with connect(control_dsn) as conn:  # its own prepared statements
        claim(conn, reg, 10)  # meets the busy lane's backlog and parks it
        others = claim(conn, reg, 40)  # fewer than asked for: only the busy lane's items remain
        assert len(others) == 30 and not any(i.target_lane_key == "hot" for i in others)
        assert claim(conn, reg, 40) == []
        claims.complete(control_conn, [first.fence])
        (second,) = claim(conn, reg, 5)  # the lane's one unparked item, from the walk
        claims.complete(control_conn, [second.fence])
        (third,) = claim(conn, reg, 5)  # a parked item: the parked lane runs nothing now
        assert (second.target_lane_key, third.target_lane_key) == ("hot", "hot")
        assert _statement_runs(conn, "%park AS%") == 1 and _statement_runs(conn, "%walk AS%") == 5
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] == 2


def test_a_claim_skips_a_busy_lane_another_claim_is_parking_instead_of_waiting(control_conn, control_dsn, reg):
    """Claims that meet the same busy lane's backlog used to queue up on the row locks of the
    one parking it (and then lost the race at their lock budget): the lane's try-lock makes
    them skip it."""
    from nexus_pipelines.control.db import connect

    enqueue(control_conn, reg, [NewWork(f"hot{i}-{reg}", "t", source_lane_key=f"h{i}", target_lane_key="hot")
                                for i in range(300)])
    claim(control_conn, reg, 1)  # the hot lane is busy from now on
    control_conn.execute("SET statement_timeout = '5s'")  # a claim that waits for the parker fails, not hangs
    with connect(control_dsn) as parker, parker.transaction(force_rollback=True):
        assert claim(parker, reg, 10) == []  # parks the lane's backlog, uncommitted
        (parked,) = parker.execute("SELECT count(*) FROM connector_work_items WHERE registration_id = %s"
                                   " AND parked", (reg,)).fetchone()
        assert parked == 298
        other = claim(control_conn, reg, 10)
        assert other == [] and not isinstance(other, claims.LaneRaceLost)


def test_the_claim_keeps_a_cached_generic_plan_while_it_takes_parked_lanes_heads(own_conn, own_dsn, reg):
    """The claim takes a parked lane's next item each time the lane frees up, and keeps its
    cached plan meanwhile (the statement that used to take them, together with the parking,
    was planned afresh on every call)."""
    from nexus_pipelines.control.db import connect

    hot = [NewWork(f"hot{i}-{reg}", "t", source_lane_key=f"h{i}", target_lane_key="hot") for i in range(10000)]
    others = [NewWork(f"o{i}-{reg}", "t", source_lane_key=f"s{i % 1000}", target_lane_key=f"t{(7 * i + i // 1000) % 1000}")
              for i in range(2000)]
    enqueue(own_conn, reg, hot + others)
    own_conn.execute("VACUUM ANALYZE connector_work_items")
    with connect(own_dsn) as conn:  # its own prepared statements
        held = []
        for _ in range(60):  # as a drain does: each claim's items complete while the next claim runs
            got = claim(conn, reg, 100, with_payload=False)
            claims.complete(conn, held)
            held = [i.fence for i in got]
        (generic, custom) = conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%%walk AS%%'").fetchone()
    assert custom <= 5 and generic >= 5, (generic, custom)


def _parked_count(conn, reg) -> int:
    (parked,) = conn.execute("SELECT count(*) FROM connector_work_items WHERE registration_id = %s AND parked",
                             (reg,)).fetchone()
    return parked


def test_a_target_lanes_backlog_beyond_one_walk_is_enqueued_parked(control_conn, reg):
    """A lane's claimable items beyond what one claim's walk visits are written parked at
    enqueue (counting the unparked ones already queued), so a hot lane's backlog is not
    rewritten by the claims that would park it; lanes within the bound stay in the walk."""
    bound = claims.WALK_MAX
    hot = [NewWork(f"hot{i}-{reg}", "t", source_lane_key=f"h{i}", target_lane_key="hot") for i in range(bound + 30)]
    calm = [NewWork(f"calm{i}-{reg}", "t", source_lane_key=f"c{i}", target_lane_key="calm") for i in range(bound)]
    enqueue(control_conn, reg, hot[:bound - 10] + calm)
    assert _parked_count(control_conn, reg) == 0
    enqueue(control_conn, reg, hot[bound - 10:] + [NewWork(f"free{i}-{reg}", "t") for i in range(5)])
    parked = [w for (w,) in control_conn.execute(
        "SELECT work_id FROM connector_work_items WHERE registration_id = %s AND parked ORDER BY work_id", (reg,))]
    hot_ids = [w for (w,) in control_conn.execute(
        "SELECT work_id FROM connector_work_items WHERE registration_id = %s AND target_lane_key = 'hot'"
        " ORDER BY work_id", (reg,))]
    assert parked == hot_ids[bound:]
    (first,) = [i for i in claim(control_conn, reg, 10) if i.target_lane_key == "hot"]
    ran = [first]
    while len(ran) < bound + 30:  # the lane still runs every item, in order, one at a time
        claims.complete(control_conn, [ran[-1].fence])
        got = [i for i in claim(control_conn, reg, 10) if i.target_lane_key == "hot"]
        assert len(got) == 1
        ran += got
    assert [i.work_id for i in ran] == hot_ids


def _walk_scan_rows(plan: dict) -> int:
    """Rows the claim's walk read from the due index (each then probed)."""
    return sum(int(n["Actual Rows"] * n["Actual Loops"]) for n in plan_nodes(cte_plan(plan, "walk"))
               if n.get("Index Name") == "connector_work_items_due")


def _flags(conn, reg) -> dict[str, tuple[bool, bool]]:
    rows = conn.execute("SELECT e.idempotency_key, w.parked, w.behind FROM connector_work_items w"
                        " JOIN connector_outbox_events e USING (event_id) WHERE w.registration_id = %s", (reg,))
    return {key.split("-")[0]: (parked, behind) for key, parked, behind in rows}


def test_a_claim_marks_the_items_behind_a_waiting_head_and_they_still_run_in_lane_order(control_conn, reg):
    """Items behind a claimable item of their source lane cannot run before it. A walk that
    meets them counts them in its bound and the parking marks them behind, with the items
    after them in their lanes: a claim never reads past more of them than its bound (with many
    source lanes crossing many target lanes they were most of the queue, read on every claim),
    and each still runs once it is its lane's head, with or without a target lane of its own,
    in its lane's order."""
    work = [NewWork(f"a{k}-{reg}", "t", source_lane_key=f"s{k}", target_lane_key="hot") for k in range(4)]
    work += [NewWork(f"f{k}x{j}-{reg}", "t", source_lane_key=f"s{k}", target_lane_key=f"t{k}x{j}" if j % 2 else None)
             for k in range(4) for j in range(60)]
    enqueue(control_conn, reg, work)
    (first,) = claim(control_conn, reg, 1)  # a0: the hot lane is busy from now on
    assert first.source_lane_key == "s0"
    # the walk passes a1 (the busy lane's first waiting item) and f0x0 (its lane runs a0), reports
    # a2 and a3 (behind a1 in the busy lane) and meets f0x1 on (behind f0x0 in its lane): nothing
    # to take
    assert claim(control_conn, reg, 5) == []
    flags = _flags(control_conn, reg)
    assert flags["a2"] == flags["a3"] == (True, False) and flags["a1"] == flags["f0x0"] == (False, False)
    # behind: the stuck items, and the items after them and after the parked heads in their lanes
    assert all(flags[f"f{k}x{j}"] == (False, True) for k in (0, 2, 3) for j in range(60) if (k, j) != (0, 0))
    with control_conn.transaction():
        control_conn.execute("UPDATE connector_work_items SET behind = false WHERE registration_id = %s", (reg,))
        # unmarked, the 239 items behind a waiting head are read only up to the walk's bound
        plan = claim_plan(control_conn, reg, 10)
        assert plan["Actual Rows"] == 1  # nothing taken
        assert _walk_scan_rows(plan) <= 10 + 2, _walk_scan_rows(plan)  # + a1 and f0x0
        raise psycopg.Rollback()
    ran, running = [first], [first]
    for _ in range(len(work)):  # a claim may take nothing while work remains (a lane race, a parking)
        if running:
            claims.complete(control_conn, [i.fence for i in running])
        running = claim(control_conn, reg, 10)
        ran += running
        if len(ran) == len(work) and not running:
            break
    assert len(ran) == len(work) and len({i.work_id for i in ran}) == len(work)
    for lane in ("s0", "s1", "s2", "s3"):
        order = [i.work_id for i in ran if i.source_lane_key == lane]
        assert order == sorted(order), lane
    assert control_conn.execute("SELECT count(*) FROM connector_work_items WHERE registration_id = %s"
                                " AND (parked OR behind)", (reg,)).fetchone() == (0,)


def test_other_lanes_drain_past_a_deep_lane_whose_head_waits_to_retry(control_conn, reg):
    """A lane whose head waits out a long retry delay holds 300 items at the front of the claim
    order. Claims mark them behind as they meet them instead of reading past all of them on
    every call, so the lanes queued after them are taken within a few claims; once the head is
    due again the lane runs all its items, in order."""
    enqueue(control_conn, reg, [NewWork(f"d{j}-{reg}", "t", source_lane_key="deep") for j in range(301)]
            + [NewWork(f"o{k}-{reg}", "t", source_lane_key=f"o{k}") for k in range(20)])
    (head,) = claim(control_conn, reg, 1)
    claims.finalize_failures(control_conn, [Failure(head.work_id, head.token, "E", "s", delay_s=3600)])
    others, calls = [], 0
    while len(others) < 20 and calls < 50:  # a claim that meets only items to mark takes none
        others += claim(control_conn, reg, 10)
        calls += 1
    assert sorted(i.source_lane_key for i in others) == sorted(f"o{k}" for k in range(20))
    # each claim marks the 10 it met and up to FOLLOW_DEPTH after them; then two claims of 10
    assert calls <= math.ceil(300 / (10 + claims.FOLLOW_DEPTH)) + 2, calls
    (behind,) = control_conn.execute("SELECT count(*) FROM connector_work_items WHERE registration_id = %s"
                                     " AND behind", (reg,)).fetchone()
    assert behind == 300
    claims.complete(control_conn, [i.fence for i in others])
    control_conn.execute("UPDATE connector_work_items SET run_after = now() WHERE work_id = %s", (head.work_id,))
    ran = []
    for _ in range(400):
        got = claim(control_conn, reg, 10)
        assert len(got) <= 1  # one lane: one item at a time
        claims.complete(control_conn, [i.fence for i in got])
        ran += got
        if len(ran) == 301:
            break
    assert [i.work_id for i in ran] == sorted(i.work_id for i in ran) and ran[0].work_id == head.work_id


def test_claims_serve_the_lanes_with_behind_items_from_a_random_point_of_their_ring(control_conn, reg):
    """A claim reads at most BEHIND_LANES lanes of behind items. Read from one place (the first
    key), the same lanes were served on every claim while they had items, and the others waited;
    each claim starts at a random point of the ring of the lanes' key hashes instead."""
    enqueue(control_conn, reg, [NewWork(f"l{k:03d}x{j}-{reg}", "t", source_lane_key=f"l{k:03d}")
                                for j in range(4) for k in range(400)])
    control_conn.execute("UPDATE connector_work_items SET behind = true WHERE registration_id = %s", (reg,))
    served = []
    for _ in range(8):  # from one place: the same 50 lanes (their first items, then their second)
        got = claim(control_conn, reg, 10)
        claims.complete(control_conn, [i.fence for i in got])
        served += [i.source_lane_key for i in got]
    assert len(served) == 80
    # eight random arcs of 50 lanes of 400 all within 50 lanes: about one chance in two million
    assert len(set(served)) > claims.BEHIND_LANES, (len(set(served)), served)


def test_a_claim_takes_its_candidates_in_claim_order_whatever_their_target_lanes(control_conn, reg):
    """A claim with more candidates than it takes (its walk's, the parked lanes' heads and the
    behind lanes' first items) takes the first in claim order. Taken in the order of their
    target lane keys, the items without one came last: older items of no target lane waited
    while parked lanes had heads to give."""
    enqueue(control_conn, reg, [NewWork(f"free{i}-{reg}", "t", source_lane_key=f"f{i}") for i in range(20)]
            + [NewWork(f"lane{k}-{reg}", "t", source_lane_key=f"s{k}", target_lane_key=f"t{k:02d}") for k in range(60)])
    control_conn.execute("UPDATE connector_work_items SET parked = true WHERE registration_id = %s"
                         " AND target_lane_key IS NOT NULL", (reg,))
    first = claim(control_conn, reg, 10)
    assert sorted(i.source_lane_key for i in first) == sorted(f"f{i}" for i in range(10)), first


def _served_parked_lanes(conn, reg, *, lanes: int, items: int, claims_run: int, batch: int) -> list[list]:
    """Parks `items` items (each its own source lane's head) in each of `lanes` target lanes
    (t000, t001, ...), then runs `claims_run` claims of `batch`, completing each: the (target
    lane, item number) pairs each took."""
    enqueue(conn, reg, [NewWork(f"t{k:03d}x{j}-{reg}", "t", source_lane_key=f"s{k:03d}x{j}",
                                target_lane_key=f"t{k:03d}") for j in range(items) for k in range(lanes)])
    conn.execute("UPDATE connector_work_items SET parked = true WHERE registration_id = %s", (reg,))
    served = []
    for _ in range(claims_run):
        got = claim(conn, reg, batch)
        claims.complete(conn, [i.fence for i in got])
        served.append(sorted((i.target_lane_key, int(i.source_lane_key[-1])) for i in got))
    return served


def test_successive_claims_go_round_the_parked_lanes(control_conn, reg):
    """A claim takes the first items of at most PARKED_LANES parked lanes. Read from the first
    key on every claim, only the first PARKED_LANES lanes were served while they had items and
    the others waited; each claim reads them from just after the lane the last one reached."""
    served = _served_parked_lanes(control_conn, reg, lanes=400, items=4, claims_run=8, batch=10)
    assert served == [[(f"t{k:03d}", 0) for k in range(n * 10, n * 10 + 10)] for n in range(8)]


def test_claims_go_round_the_parked_lanes_and_start_again_at_the_first_key(control_conn, reg):
    """More parked lanes than a claim reads: once past the last key the next claim reads from
    the first again (read from the first key every time, the third claim read t000-t049 and took
    the second items of t000-t009 before the first items of t050-t059)."""
    served = _served_parked_lanes(control_conn, reg, lanes=60, items=2, claims_run=4, batch=20)
    # the first items of t000-t059 twenty at a time, then round again: the second items of t000-t019
    assert served == [[(f"t{k:03d}", 0) for k in range(n * 20, n * 20 + 20)] for n in range(3)] \
        + [[(f"t{k:03d}", 1) for k in range(20)]]
