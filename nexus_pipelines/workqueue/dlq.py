"""The dead-letter read path and operator replay.

Dead items are read from `connector_work_items` (the single failure owner of a
WorkItem generation) joined to their immutable event and receipt for context.

Replay is an explicit new attempt of the same work item (the unique
`(event_id, work_type)` row), fenced by the token it saw, and it fails closed unless:
the item is dead; its generation is the registration's active generation; the
event's route version equals the route version bound by that generation's activation
receipt; and the item carries no rollback fence. The immutable event is never
changed; every replay is recorded in `workqueue_replays`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg import Connection


class ReplayRefused(RuntimeError):
    """Replay cannot be proven safe; nothing was changed."""


@dataclass(frozen=True)
class DeadItem:
    work_id: int
    registration_id: str
    revision: int
    work_type: str
    queue_class: str
    attempts: int
    replays: int
    failure_class: str | None
    failure_summary: str | None
    finished_at: datetime | None
    event_id: int
    route_id: str
    route_version: int
    source_kind: str
    source_id: str
    idempotency_key: str
    receipt_id: int
    namespace: str
    delivery_id: str
    accepted_at: datetime


_LIST = """
SELECT w.work_id, w.registration_id, w.revision, w.work_type, w.queue_class, w.attempts, w.replays,
       w.failure_class, w.failure_summary, w.finished_at,
       e.event_id, e.route_id, e.route_version, e.source_kind, e.source_id, e.idempotency_key,
       r.receipt_id, r.namespace, r.delivery_id, r.accepted_at
  FROM connector_work_items w
  JOIN connector_outbox_events e ON e.event_id = w.event_id
  JOIN ingress_receipts r ON r.receipt_id = e.receipt_id
 WHERE w.state = 'dead' {reg_filter} AND w.work_id > %(after)s
 ORDER BY w.work_id
 LIMIT %(limit)s
"""


def list_dead(
    conn: Connection, *, registration_id: str | None = None, after_work_id: int = 0, limit: int = 50
) -> list[DeadItem]:
    sql = _LIST.format(reg_filter="AND w.registration_id = %(reg)s" if registration_id else "")
    rows = conn.execute(sql, {"reg": registration_id, "after": after_work_id, "limit": limit}).fetchall()
    return [DeadItem(*r) for r in rows]


@dataclass(frozen=True)
class ReplayResult:
    work_id: int
    replays: int
    registration_id: str
    revision: int


def replay(conn: Connection, work_id: int, *, requested_by: str) -> ReplayResult:
    """Make a dead item claimable again as a new attempt; raises ReplayRefused when unsafe."""
    with conn.transaction():
        row = conn.execute(
            """SELECT w.state, w.lease_token, w.registration_id, w.revision, w.rollback_fence_id,
                      e.route_id, e.route_version, g.status, g.route_versions ->> e.route_id,
                      w.failure_class, w.failure_summary
                 FROM connector_work_items w
                 JOIN connector_outbox_events e ON e.event_id = w.event_id
                 LEFT JOIN workqueue_generations g
                        ON g.registration_id = w.registration_id AND g.revision = w.revision
                WHERE w.work_id = %s
                  FOR UPDATE OF w""",
            (work_id,),
        ).fetchone()
        if row is None:
            raise ReplayRefused(f"work item {work_id} does not exist")
        (state, token, reg, rev, fence, route_id, route_version, gen_status, bound_version, fclass, summary) = row
        if state != "dead":
            raise ReplayRefused(f"work item {work_id} is {state!r}; only dead items can be replayed")
        if fence is not None:
            raise ReplayRefused(f"work item {work_id} is rollback-fenced ({fence}); replay is not allowed")
        if gen_status != "active":
            raise ReplayRefused(
                f"work item {work_id} belongs to {reg}@{rev}, which is {gen_status or 'not activated'!r}; "
                "replay needs its generation to be the active one"
            )
        if bound_version is None or int(bound_version) != route_version:
            raise ReplayRefused(
                f"work item {work_id}: route {route_id!r} version {route_version} of its event is not the version "
                f"bound by the activation receipt ({bound_version or 'none'}); replay fails closed"
            )
        (replays,) = conn.execute(
            """UPDATE connector_work_items
                  SET state = 'pending', attempts = 0, replays = replays + 1, run_after = now(), outcome = NULL,
                      finished_at = NULL, updated_at = now()
                WHERE work_id = %s AND state = 'dead' AND lease_token IS NOT DISTINCT FROM %s
            RETURNING replays""",
            (work_id, token),
        ).fetchone()
        conn.execute(
            """INSERT INTO workqueue_replays (work_id, requested_by, prior_failure_class, prior_failure_summary)
               VALUES (%s, %s, %s, %s)""",
            (work_id, requested_by, fclass, summary),
        )
    return ReplayResult(work_id, replays, reg, rev)
