"""The claim statement on 100,000 items is index-driven (no sequential scan)."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import psycopg
import pytest

from nexus_pipelines.workqueue.claims import claim_sql
from nexus_pipelines.workqueue.generations import activate

from .support import cte_plan, plan_nodes

pytestmark = pytest.mark.slow

N = 100_000


@pytest.fixture(scope="module")
def big_queue(control_dsn):
    from nexus_pipelines.control.db import connect

    with connect(control_dsn) as conn:
        with conn.transaction():
            (rid,) = conn.execute(
                """INSERT INTO ingress_receipts (registration_id, revision, namespace, delivery_id, route_key,
                       received_at, body_ref, payload_hash, routing_status)
                   VALUES ('big', 1, 'bulk', 'big', 'bulk', now(), 'ref', 'h', 'materialized') RETURNING receipt_id"""
            ).fetchone()
            conn.execute(
                """INSERT INTO connector_outbox_events (receipt_id, registration_id, revision, route_id, route_version,
                       source_kind, source_id, idempotency_key, delivery_seq, payload_hash)
                   SELECT %s, 'big', 1, 'bulk', 1, 'k', g::text, 'big-' || g, 0, 'h' FROM generate_series(1, %s) g""",
                (rid, N),
            )
            conn.execute(
                """INSERT INTO connector_work_items (event_id, registration_id, revision, work_type, queue_class,
                       source_lane_key, target_lane_key, state)
                   SELECT event_id, 'big', 1, 't', CASE WHEN event_id % 3 = 0 THEN 'bulk' ELSE 'default' END,
                          'src-' || (event_id % 5000), CASE WHEN event_id % 2 = 0 THEN 'tgt-' || (event_id % 700) END,
                          CASE WHEN event_id % 10 = 0 THEN 'completed' ELSE 'pending' END
                     FROM connector_outbox_events WHERE registration_id = 'big'"""
            )
        activate(conn, "big", 1, recorded_by="test", route_versions={"bulk": 1})
        # a realistic number of items in flight
        from nexus_pipelines.workqueue.claims import claim_batch

        for _ in range(10):
            claim_batch(conn, owner="busy", limit=100, lease_ttl=timedelta(minutes=5), registration_ids=["big"])
        conn.execute("ANALYZE connector_work_items")
        conn.execute("ANALYZE connector_outbox_events")
        conn.execute("ANALYZE workqueue_generations")
        yield conn


def _plan(conn, sql: str, params: dict) -> str:
    cur = psycopg.ClientCursor(conn)
    cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
    return json.dumps(cur.fetchone()[0])


@pytest.mark.parametrize("classes", [None, ["default", "bulk"]])
def test_claim_plan_uses_indexes_and_no_seq_scan(big_queue, classes):
    sql = claim_sql(queue_classes=classes is not None, work_types=True, registrations=True, with_payload=True)
    params = {
        "owner": "w", "ttl": timedelta(seconds=30), "limit": 100, "scan": 200, "classes": classes or [],
        "types": ["t"], "registrations": ["big"], "behind_start": 0, "parked_after": "",
    }
    plan = _plan(big_queue, sql, params)
    scans = {(node["Node Type"], node.get("Relation Name"), node.get("Index Name")) for node in _nodes(json.loads(plan))}
    seq = {s for s in scans if s[0] == "Seq Scan" and s[1] in ("connector_work_items", "connector_outbox_events")}
    assert not seq, plan
    indexes = {s[2] for s in scans if s[2]}
    assert {"connector_work_items_due", "connector_work_items_source_lane", "connector_work_items_target_inflight",
            "connector_work_items_pkey"} <= indexes, indexes
    assert "Sort" not in {s[0] for s in scans if s[1] is None} or True


def _nodes(plan):
    return plan_nodes(plan[0]["Plan"])


def test_claim_on_the_big_queue_returns_lane_heads(big_queue):
    from nexus_pipelines.workqueue.claims import claim_batch

    got = []
    for _ in range(5):  # a claim that parks busy lanes' backlogs takes fewer: the drain claims again
        got += claim_batch(big_queue, owner="w", limit=100, lease_ttl=timedelta(seconds=30), registration_ids=["big"])
    assert len(got) >= 100
    assert len({i.source_lane_key for i in got}) == len(got)
    targets = [i.target_lane_key for i in got if i.target_lane_key]
    assert len(targets) == len(set(targets))


def _generic_plan_scans(conn, sql: str, params: dict, types: dict) -> set[tuple]:
    """Scans of the generic plan of `sql` prepared server-side (what a prepared hot path runs)."""
    plan = _generic_plan(conn, sql, params, types)
    return {(node["Node Type"], node.get("Relation Name"), node.get("Index Name")) for node in _nodes(plan)}


def _generic_plan(conn, sql: str, params: dict, types: dict) -> list:
    """The generic plan (EXPLAIN, JSON) of `sql` prepared server-side."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)[sb]", sql)))
    text = sql
    for n, name in enumerate(names, 1):
        text = re.sub(rf"%\({name}\)[sb]", f"${n}", text)
    conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        conn.execute(f"PREPARE hot_path ({', '.join(types[name] for name in names)}) AS {text}")
        cur = psycopg.ClientCursor(conn)
        placeholders = ", ".join("%s" for _ in names)
        with conn.transaction():
            cur.execute(f"EXPLAIN (FORMAT JSON) EXECUTE hot_path ({placeholders})", [params[name] for name in names])
            plan = cur.fetchone()[0]
            raise psycopg.Rollback()
    finally:
        conn.execute("DEALLOCATE ALL")
        conn.execute("RESET plan_cache_mode")
    return plan


@pytest.mark.parametrize("statement", ["_COMPLETE", "_RENEW", "_FAIL"])
def test_fenced_hot_paths_are_driven_by_the_primary_key(big_queue, statement):
    # With 1,000 running items, a plan driven by the lease index would scan every running
    # row and probe the fence list once per row; the fences must drive primary-key probes.
    from nexus_pipelines.workqueue import claims

    sql = getattr(claims, statement)
    ids, tokens = zip(*big_queue.execute(
        "SELECT work_id, lease_token FROM connector_work_items WHERE registration_id = 'big' AND state = 'running'"
        " ORDER BY work_id LIMIT 100"
    ).fetchall())
    params = {
        "ids": list(ids), "tokens": list(tokens), "ttl": timedelta(seconds=30), "outcome": "succeeded",
        "classes": ["e"] * 100, "summaries": ["s"] * 100, "delays": [1.0] * 100, "terminal": [False] * 100,
        "uncounted": [False] * 100,
    }
    types = {"ids": "bigint[]", "tokens": "bigint[]", "ttl": "interval", "outcome": "text", "classes": "text[]",
             "summaries": "text[]", "delays": "float8[]", "terminal": "boolean[]",
             "uncounted": "boolean[]"}
    scans = _generic_plan_scans(big_queue, sql, params, types)
    on_items = {s for s in scans if s[1] == "connector_work_items" and s[0] != "ModifyTable"}
    assert on_items and all(s[2] == "connector_work_items_pkey" for s in on_items), scans


def test_reclaim_reads_only_the_running_rows_index(big_queue):
    from nexus_pipelines.workqueue import claims

    scans = _generic_plan_scans(big_queue, claims._EXPIRED_LEASES, {"limit": 500}, {"limit": "bigint"})
    on_items = {s for s in scans if s[1] == "connector_work_items"}
    assert on_items == {("Index Scan", "connector_work_items", "connector_work_items_running")}, scans


def test_lease_counts_read_only_the_running_rows_index(big_queue):
    from nexus_pipelines.workqueue import stats

    cur = psycopg.ClientCursor(big_queue)
    cur.execute("EXPLAIN (FORMAT JSON) " + stats._LEASES)
    scans = {(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in _nodes(cur.fetchone()[0])}
    on_items = {s for s in scans if s[1] == "connector_work_items"}
    assert on_items and {s[2] for s in on_items} == {"connector_work_items_running"}, scans


def test_the_claim_statement_is_planned_once_and_then_cached(big_queue, control_dsn):
    """The claim every call runs, at a drain's full batch, keeps a cached generic plan (after
    the server's five custom ones) instead of being planned afresh each time."""
    from nexus_pipelines.control.db import connect
    from nexus_pipelines.workqueue.claims import claim_batch

    with connect(control_dsn) as conn, conn.transaction(force_rollback=True):  # its own prepared statements
        for _ in range(10):
            claim_batch(conn, owner="w", limit=100, lease_ttl=timedelta(seconds=30), registration_ids=["big"])
        (generic, custom) = conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%%walk AS%%' AND statement NOT LIKE '%%park AS%%'").fetchone()
    assert custom <= 5 and generic >= 5, (generic, custom)


def test_the_claim_finds_behind_items_by_primary_key(big_queue):
    """The fixture's claims parked busy lanes and marked the items behind them; the claim's
    cached plan looks each lane's first behind item up by primary key, never through the due
    index (which, matched by a restated state list, a generic plan read once per lane)."""
    (behind,) = big_queue.execute("SELECT count(*) FROM connector_work_items WHERE behind").fetchone()
    assert behind > 0
    sql = claim_sql(registrations=True, with_payload=True)
    params = {"owner": "w", "ttl": timedelta(seconds=30), "limit": 100, "scan": 100, "registrations": ["big"],
              "behind_start": 0, "parked_after": ""}
    types = {"owner": "text", "ttl": "interval", "limit": "bigint", "scan": "bigint", "registrations": "text[]",
             "behind_start": "bigint", "parked_after": "text"}
    plan = _generic_plan(big_queue, sql, params, types)
    indexes = {n.get("Index Name") for n in plan_nodes(cte_plan(plan[0]["Plan"], "behind_heads"))
               if n.get("Relation Name") == "connector_work_items"}
    assert "connector_work_items_pkey" in indexes and "connector_work_items_due" not in indexes, indexes
