"""Queue health: exact diagnostics for operators, and cheap due-work probes for sensors.

`queue_health` is a scoped diagnostic (it counts rows by state and queue class); the
sensor path uses only `due_work`, bounded index probes per queue class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import Connection

_DEPTH = """
SELECT state, queue_class, count(*)
  FROM connector_work_items
 WHERE state IN ('pending', 'retry', 'running', 'dead')
 GROUP BY state, queue_class
"""

_LEASES = """
SELECT count(*) FILTER (WHERE lease_until > now()), count(*) FILTER (WHERE lease_until <= now())
  FROM connector_work_items WHERE state = 'running' AND lease_owner IS NOT NULL AND lease_until IS NOT NULL
"""

_OLDEST_DUE = """
SELECT extract(epoch FROM now() - min(w.run_after))
  FROM workqueue_generations g
  JOIN connector_work_items w ON w.registration_id = g.registration_id AND w.revision = g.revision
 WHERE g.status = 'active' AND w.state IN ('pending', 'retry') AND w.run_after <= now()
"""

_TOTALS = """
SELECT count(*) FILTER (WHERE state = 'completed'), coalesce(sum(reclaims), 0), coalesce(sum(replays), 0),
       count(*) FILTER (WHERE attempts > 1 OR state = 'retry')
  FROM connector_work_items
"""

_RECEIPTS = "SELECT routing_status, count(*) FROM ingress_receipts GROUP BY routing_status"

_GENERATIONS = "SELECT status, count(*) FROM workqueue_generations GROUP BY status"


def queue_health(conn: Connection, *, include_totals: bool = True) -> dict[str, Any]:
    """Depth per state and queue class, oldest due age, leases, reclaim/retry/dead counts."""
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
        "generations": dict(conn.execute(_GENERATIONS).fetchall()),
    }
    if include_totals:
        completed, reclaims, replays, retried = conn.execute(_TOTALS).fetchone()
        health.update(completed=completed, reclaims=int(reclaims), replays=int(replays), retried_items=retried)
    return health


_DUE = """
SELECT count(*) FROM (
    SELECT 1
      FROM workqueue_generations g
     CROSS JOIN LATERAL (
         SELECT 1 FROM connector_work_items w
          WHERE w.registration_id = g.registration_id AND w.revision = g.revision
            AND w.state IN ('pending', 'retry') AND w.run_after <= now()
            AND w.queue_class = %(cls)s
          LIMIT %(cap)s) w
     WHERE g.status = 'active'
     LIMIT %(cap)s) due
"""

_CLASSES = """
SELECT DISTINCT w.queue_class
  FROM workqueue_generations g
  JOIN connector_work_items w ON w.registration_id = g.registration_id AND w.revision = g.revision
 WHERE g.status = 'active' AND w.state IN ('pending', 'retry') AND w.run_after <= now()
"""


def due_work(conn: Connection, queue_classes: Sequence[str] | None = None, *, cap: int = 10_000) -> dict[str, int]:
    """Due claimable items per queue class, counted up to `cap` each (index probes only)."""
    classes = list(queue_classes) if queue_classes is not None else [r[0] for r in conn.execute(_CLASSES)]
    counts = {}
    for cls in classes:
        (count,) = conn.execute(_DUE, {"cls": cls, "cap": cap}, prepare=True).fetchone()  # a polled probe
        counts[cls] = count
    return counts


def due_receipts(conn: Connection, *, cap: int = 10_000) -> int:
    (count,) = conn.execute(
        """SELECT count(*) FROM (SELECT 1 FROM ingress_receipts
            WHERE routing_status IN ('pending', 'routing') AND next_attempt_at <= now() LIMIT %s) due""",
        (cap,),
    ).fetchone()
    return count
