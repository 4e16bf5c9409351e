"""The work-item insert's plan: linear in the batch whatever statistics the tables have."""

from __future__ import annotations

import re
import uuid

import psycopg

from nexus_pipelines.workqueue import receipts
from nexus_pipelines.workqueue.receipts import NewWork

from .conftest import enqueue

LANES, PER_LANE = 300, 10


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_a_bulk_enqueue_counts_each_target_lanes_queue_once_after_the_work_items_alone_were_analyzed(control_conn):
    """An autoanalyze in the middle of a load takes the work items' and events' statistics before
    the other tables'. The insert, prepared as psycopg prepares a statement it runs again, must
    still count a lane's queued items once per lane of the batch: its generic plan once counted
    them again for every row (5,000 items over 500 lanes took minutes)."""
    reg = f"plan-{uuid.uuid4().hex[:6]}"
    enqueue(control_conn, reg, [NewWork(f"{reg}-{i}", "t", source_lane_key=f"s{i}", target_lane_key=f"L{i % LANES}")
                                for i in range(LANES * PER_LANE)])
    control_conn.execute("ANALYZE connector_outbox_events")
    control_conn.execute("ANALYZE connector_work_items")
    rows = control_conn.execute(
        "SELECT event_id, source_lane_key, target_lane_key FROM connector_work_items WHERE registration_id = %s"
        " ORDER BY work_id", (reg,)).fetchall()
    n = len(rows)
    params = {"events": [r[0] for r in rows], "regs": [reg] * n, "revs": [1] * n, "types": ["other"] * n,
              "classes": ["default"] * n, "max": [5] * n, "prio": [0] * n, "src": [r[1] for r in rows],
              "tgt": [r[2] for r in rows]}
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)b", receipts._INSERT_WORK_ITEMS)))
    prepared = re.sub(r"%\((\w+)\)b", lambda m: f"${names.index(m.group(1)) + 1}", receipts._INSERT_WORK_ITEMS)
    with control_conn.transaction(force_rollback=True):
        control_conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        control_conn.execute("PREPARE bulk_insert AS " + prepared)
        arguments = ", ".join(["%s"] * len(names))
        (explained,) = psycopg.ClientCursor(control_conn).execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE bulk_insert({arguments})", [params[k] for k in names]).fetchone()
        control_conn.execute("DEALLOCATE bulk_insert")
    plan = explained[0]["Plan"]
    counts = [node for node in _nodes(plan) if node.get("Relation Name") == "connector_work_items"
              and node["Node Type"] != "ModifyTable"]
    assert sum(node["Actual Loops"] for node in counts) == LANES
    assert plan["Plans"][0]["Actual Rows"] == n  # every row of the batch was inserted (and rolled back)
