"""Queue health: exact diagnostics for operators, and cheap due-work probes for sensors.

`queue_health` is a scoped diagnostic (it counts rows by state and queue class, and
the rollback fences with their legacy outcomes); the sensors use only `due_work` and
`due_event_paths`, bounded index probes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import Connection

from nexus_pipelines.workqueue.claims import scheduler_lease_name
from nexus_pipelines.workqueue.states import (
    ACTIVE,
    AWAITING_LEGACY_OUTCOME,
    CLAIMABLE,
    COMPLETED,
    DEAD,
    EVENT_PATH,
    EXECUTABLE,
    RECONCILED_LEGACY_TERMINAL,
    RETRY,
    RUNNING,
    UNKNOWN,
    WORK_ITEM_PATH,
    sql_in,
)

_DEPTH = f"""
SELECT state, queue_class, count(*)
  FROM connector_work_items
 WHERE state IN {sql_in((*CLAIMABLE, RUNNING, DEAD))}
 GROUP BY state, queue_class
"""

_LEASES = f"""
SELECT count(*) FILTER (WHERE lease_until > now()), count(*) FILTER (WHERE lease_until <= now())
  FROM connector_work_items WHERE state = '{RUNNING}' AND lease_owner IS NOT NULL AND lease_until IS NOT NULL
"""

_CLAIMABLE_GENERATION = f"g.status = '{ACTIVE}' AND g.claim_path = '{WORK_ITEM_PATH}'"

_OLDEST_DUE = f"""
SELECT extract(epoch FROM now() - min(w.run_after))
  FROM workqueue_generations g
  JOIN connector_work_items w ON w.registration_id = g.registration_id AND w.revision = g.revision
 WHERE {_CLAIMABLE_GENERATION} AND w.state IN {sql_in(CLAIMABLE)} AND w.run_after <= now()
"""

_TOTALS = f"""
SELECT count(*) FILTER (WHERE state = '{COMPLETED}'), coalesce(sum(reclaims), 0), coalesce(sum(replays), 0),
       count(*) FILTER (WHERE attempts > 1 OR state = '{RETRY}')
  FROM connector_work_items
"""

_RECEIPTS = "SELECT routing_status, count(*) FROM ingress_receipts GROUP BY routing_status"

_GENERATIONS = "SELECT claim_path, status, count(*) FROM workqueue_generations GROUP BY claim_path, status"

_EVENT_PATH = "SELECT state, count(*) FROM event_executions GROUP BY state"

_FENCES = f"""
SELECT (SELECT count(*) FROM workqueue_generation_receipts WHERE kind = 'rollback_fence'),
       count(*) FILTER (WHERE w.state = '{AWAITING_LEGACY_OUTCOME}'),
       count(*) FILTER (WHERE w.state = '{AWAITING_LEGACY_OUTCOME}' AND r.outcome = '{UNKNOWN}'),
       count(*) FILTER (WHERE w.state = '{RECONCILED_LEGACY_TERMINAL}'),
       (SELECT count(*) FROM legacy_outcome_receipts)
  FROM connector_work_items w
  LEFT JOIN LATERAL (SELECT outcome FROM legacy_outcome_receipts l WHERE l.work_id = w.work_id
                      ORDER BY version DESC LIMIT 1) r ON true
 WHERE w.rollback_fence_id IS NOT NULL
"""


def _generations(conn: Connection) -> dict[str, dict[str, int]]:
    by_path: dict[str, dict[str, int]] = {}
    for path, status, count in conn.execute(_GENERATIONS).fetchall():
        by_path.setdefault(path, {})[status] = count
    return by_path


def _fences(conn: Connection) -> dict[str, int]:
    fences, awaiting, unknown, reconciled, receipts = conn.execute(_FENCES).fetchone()
    return {"rollback_fences": fences, "awaiting_legacy_outcome": awaiting, "unknown_legacy_outcome": unknown,
            "reconciled_legacy_terminal": reconciled, "legacy_outcome_receipts": receipts}


def queue_health(conn: Connection, *, include_totals: bool = True) -> dict[str, Any]:
    """Depth per state and queue class, oldest due age, leases, reclaim/retry/dead counts, generations
    per claim path and status, the Event path's executions per state, and the rollback fences."""
    depth: dict[str, dict[str, int]] = {}
    by_state: dict[str, int] = {"pending": 0, "retry": 0, "running": 0, "dead": 0}
    for state, queue_class, count in conn.execute(_DEPTH).fetchall():
        depth.setdefault(queue_class, {})[state] = count
        by_state[state] = by_state.get(state, 0) + count
    active, expired = conn.execute(_LEASES).fetchone()
    (oldest,) = conn.execute(_OLDEST_DUE).fetchone()
    health: dict[str, Any] = {
        "depth_by_queue_class": depth,
        "pending": by_state["pending"],
        "retry_waiting": by_state["retry"],
        "running": by_state["running"],
        "dead": by_state["dead"],
        "active_leases": active,
        "expired_leases": expired,
        "oldest_due_age_s": round(float(oldest), 3) if oldest is not None else 0.0,
        "receipts": dict(conn.execute(_RECEIPTS).fetchall()),
        "generations": _generations(conn),
        "event_path": dict(conn.execute(_EVENT_PATH).fetchall()),
        "fences": _fences(conn),
    }
    if include_totals:
        completed, reclaims, replays, retried = conn.execute(_TOTALS).fetchone()
        health.update(completed=completed, reclaims=int(reclaims), replays=int(replays), retried_items=retried)
    return health


_DUE = f"""
SELECT count(*) FROM (
    SELECT 1
      FROM workqueue_generations g
     CROSS JOIN LATERAL (
         SELECT 1 FROM connector_work_items w
          WHERE w.registration_id = g.registration_id AND w.revision = g.revision
            AND w.state IN {sql_in(CLAIMABLE)} AND w.run_after <= now()
            AND w.queue_class = %(cls)s
          LIMIT %(cap)s) w
     WHERE {_CLAIMABLE_GENERATION}
     LIMIT %(cap)s) due
"""

_CLASSES = f"""
SELECT DISTINCT w.queue_class
  FROM workqueue_generations g
  JOIN connector_work_items w ON w.registration_id = g.registration_id AND w.revision = g.revision
 WHERE {_CLAIMABLE_GENERATION} AND w.state IN {sql_in(CLAIMABLE)} AND w.run_after <= now()
"""


def due_work(conn: Connection, queue_classes: Sequence[str] | None = None, *, cap: int = 10_000) -> dict[str, int]:
    """Due claimable items per queue class, counted up to `cap` each (index probes only)."""
    classes = list(queue_classes) if queue_classes is not None else [r[0] for r in conn.execute(_CLASSES)]
    counts = {}
    for cls in classes:
        (count,) = conn.execute(_DUE, {"cls": cls, "cap": cap}, prepare=True).fetchone()  # a polled probe
        counts[cls] = count
    return counts


_DUE_EVENT_PATHS = f"""
SELECT g.registration_id, g.revision, due.n
  FROM workqueue_generations g
 CROSS JOIN LATERAL (
     SELECT count(*) AS n FROM (
         SELECT 1 FROM event_executions x
          WHERE x.registration_id = g.registration_id AND x.revision = g.revision
            AND x.state IN {sql_in(EXECUTABLE)} AND x.run_after <= now()
          LIMIT %(cap)s) d) due
 WHERE g.claim_path = '{EVENT_PATH}' AND g.status = '{ACTIVE}' AND due.n > 0
 ORDER BY g.registration_id, g.revision
"""


def due_event_paths(conn: Connection, *, cap: int = 10_000) -> list[tuple[str, int, int]]:
    """Event-owned active generations with due work and no live scheduler lease: (registration, revision, due)."""
    due = conn.execute(_DUE_EVENT_PATHS, {"cap": cap}).fetchall()
    names = [scheduler_lease_name(reg, rev) for reg, rev, _ in due]
    held = {r[0] for r in conn.execute(
        "SELECT lease_name FROM leases WHERE lease_name = ANY(%s) AND expires_at > clock_timestamp()", (names,))}
    return [(reg, rev, n) for (reg, rev, n), name in zip(due, names) if name not in held]


def due_receipts(conn: Connection, *, cap: int = 10_000) -> int:
    (count,) = conn.execute(
        """SELECT count(*) FROM (SELECT 1 FROM ingress_receipts
            WHERE routing_status IN ('pending', 'routing') AND next_attempt_at <= now() LIMIT %s) due""",
        (cap,),
    ).fetchone()
    return count
