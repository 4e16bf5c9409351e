"""The ticket row's triage state, priority and status are a projection of its append-only
facts; the commands keep it current in their own transaction, and `rebuild` recomputes
it from the facts alone (the latest triage fact, the latest priority fact, cancelled
after a DUPLICATE or REJECTED disposition, done once a success proof is recorded).
"""

from __future__ import annotations

from psycopg import Connection

_REBUILD = """
WITH derived AS (
    SELECT t.ticket_id,
           coalesce((SELECT f.triage_state FROM ticket_triage_facts f WHERE f.ticket_id = t.ticket_id
                      ORDER BY f.fact_id DESC LIMIT 1), t.triage_state) AS triage_state,
           coalesce((SELECT f.priority FROM ticket_priority_facts f WHERE f.ticket_id = t.ticket_id
                      ORDER BY f.fact_id DESC LIMIT 1), t.priority) AS priority,
           EXISTS (SELECT 1 FROM ticket_proofs p WHERE p.ticket_id = t.ticket_id) AS proved
      FROM tickets t
     WHERE %(ids)s::bigint[] IS NULL OR t.ticket_id = ANY(%(ids)s)
), projected AS (
    SELECT ticket_id, triage_state, priority,
           CASE WHEN triage_state IN ('DUPLICATE', 'REJECTED') THEN 'cancelled'
                WHEN proved THEN 'done' ELSE 'open' END AS status
      FROM derived
)
UPDATE tickets t
   SET triage_state = p.triage_state, priority = p.priority, status = p.status, updated_at = clock_timestamp()
  FROM projected p
 WHERE t.ticket_id = p.ticket_id
   AND (t.triage_state, t.priority, t.status) IS DISTINCT FROM (p.triage_state, p.priority, p.status)
"""


def rebuild(conn: Connection, ticket_ids: list[int] | None = None) -> int:
    """Recompute the projection from the facts; returns how many ticket rows it corrected."""
    with conn.transaction():
        return conn.execute(_REBUILD, {"ids": ticket_ids}).rowcount
