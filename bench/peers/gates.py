"""Timing of the work queue's rollback fence and re-cutover (docs/design/work-queue.md) on N
pending items.

Each scenario builds its generation through the public API (not timed), then times the
gate calls an operator's `queue rollback` / `queue recutover` make, and verifies the
result in the database.
"""

from __future__ import annotations

import time
import uuid

from bench.peers.common import log
from nexus_pipelines.control.db import connect
from nexus_pipelines.control.migrations import apply_migrations
from nexus_pipelines.local.postgres import drop_database, ensure_database, with_database
from nexus_pipelines.workqueue import event_path, generations, rollback
from nexus_pipelines.workqueue.handlers import HandlerRegistry
from nexus_pipelines.workqueue.receipts import NewWork, enqueue_work_items

WORK_TYPE = "gates.noop"
ROUTES = {"bulk": 1}


def _work(prefix: str, n: int) -> list[NewWork]:
    return [NewWork(f"{prefix}-{i}", WORK_TYPE, source_lane_key=f"s{i % 1000}", target_lane_key=f"t{i % 997}")
            for i in range(n)]


def _timed(what: str, fn):
    started = time.monotonic()
    value = fn()
    took = time.monotonic() - started
    log(f"{what}: {took:.2f}s")
    return value, round(took, 3)


def _analyze(conn) -> None:
    for table in ("connector_work_items", "connector_outbox_events", "event_executions"):
        conn.execute(f"VACUUM ANALYZE {table}")


def _count(conn, sql: str, *params) -> int:
    return conn.execute(sql, params).fetchone()[0]


def _fence(conn, n: int) -> dict:
    reg = "gates-fence"
    enqueue_work_items(conn, _work(reg, n), registration_id=reg, revision=1)
    generations.activate(conn, reg, 1, recorded_by="bench", route_versions=ROUTES)
    _analyze(conn)
    _, disable_s = _timed("rollback: claims disabled", lambda: rollback.disable_claims(conn, reg, 1, recorded_by="bench"))
    receipt, fence_s = _timed(f"rollback fence of {n} pending items",
                              lambda: rollback.fence(conn, reg, 1, recorded_by="bench"))
    fenced = _count(conn, "SELECT count(*) FROM connector_work_items WHERE rollback_fence_id = %s"
                          " AND state = 'awaiting_legacy_outcome'", receipt.receipt_id)
    handed = _count(conn, "SELECT count(*) FROM event_executions WHERE rollback_fence_id = %s AND state = 'pending'",
                    receipt.receipt_id)
    return {"rollback_disable_claims_s": disable_s, "rollback_fence_s": fence_s,
            "fence_verified": fenced == handed == receipt.proof["fenced_items"] == n}


def _recutover(conn, n: int) -> dict:
    reg = "gates-recutover"
    generations.activate(conn, reg, 1, recorded_by="bench", route_versions=ROUTES, claim_path="event")
    enqueue_work_items(conn, _work(reg, n), registration_id=reg, revision=1)  # Event executions: no work item rows
    _analyze(conn)
    _, quiesce_s = _timed("re-cutover: Event admission stopped",
                          lambda: generations.quiesce(conn, reg, 1, recorded_by="bench"))
    receipt, cutover_s = _timed(f"re-cutover of {n} pending Event executions", lambda: generations.activate(
        conn, reg, 1, recorded_by="bench", route_versions=ROUTES))
    made = _count(conn, """SELECT count(*) FROM connector_work_items w JOIN event_executions x USING (work_id)
                            WHERE w.registration_id = %s AND w.state = 'pending' AND x.state = 'transferred'""", reg)
    return {"recutover_quiesce_s": quiesce_s, "recutover_s": cutover_s,
            "recutover_verified": made == receipt.proof["cutover"]["materialized_work_items"] == n}


def _event_path_then_recutover(dsn: str, conn, n: int) -> dict:
    reg = "gates-fence"
    report, run_s = _timed(f"Event path runs {n} fenced items", lambda: event_path.run_event_path(
        dsn, HandlerRegistry({WORK_TYPE: lambda item: None}), reg, 1))
    generations.quiesce(conn, reg, 1, recorded_by="bench")
    receipt, cutover_s = _timed(f"re-cutover verifying {n} reconciled fenced items", lambda: generations.activate(
        conn, reg, 1, recorded_by="bench", route_versions=ROUTES))
    reconciled = _count(conn, "SELECT count(*) FROM connector_work_items WHERE registration_id = %s"
                              " AND state = 'reconciled_legacy_terminal'", reg)
    return {"event_path_items_per_s": round(report.completed / run_s, 1) if run_s else None,
            "recutover_after_fence_s": cutover_s,
            "event_path_verified": report.completed == reconciled == receipt.proof["cutover"]["reconciled"] == n}


def measure_gates(server_dsn: str, n: int, *, with_event_path: bool = False) -> dict:
    dbname = f"bench_wq_gates_{uuid.uuid4().hex[:8]}"
    ensure_database(server_dsn, dbname)
    dsn = with_database(server_dsn, dbname)
    try:
        apply_migrations(dsn)
        with connect(dsn) as conn:
            result = {"gates_items": n, **_fence(conn, n), **_recutover(conn, n)}
            if with_event_path:
                result.update(_event_path_then_recutover(dsn, conn, n))
        result["verified"] = all(v for k, v in result.items() if k.endswith("verified"))
        return result
    finally:
        drop_database(server_dsn, dbname)
