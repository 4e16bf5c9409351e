"""The dead-letter read path and operator replay.

Failures are read from the claim path that owns each generation, never from both:
dead work items for a WorkItem-owned generation, failed (or unknown) Event executions
for an Event-owned one, each joined to its immutable event and receipt for context.

Replay is an explicit new attempt of the same work item (the unique
`(event_id, work_type)` row), fenced by the token it saw, and it fails closed unless:
the item is dead; its generation is the registration's active WorkItem generation; the
event's route version equals the route version bound by that generation's activation
receipt. The immutable event is never
changed; every replay is recorded in `workqueue_replays`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg import Connection

from nexus_pipelines.workqueue.states import (
    ACTIVE,
    DEAD,
    EVENT_PATH,
    FAILED,
    PENDING,
    UNKNOWN,
    WORK_ITEM_PATH,
    sql_in,
)


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
    claim_path: str = WORK_ITEM_PATH  # the path that failed it (and owns its generation)


_LIST = f"""
SELECT f.work_id, f.registration_id, f.revision, f.work_type, f.queue_class, f.attempts, f.replays,
       f.failure_class, f.failure_summary, f.finished_at,
       e.event_id, e.route_id, e.route_version, e.source_kind, e.source_id, e.idempotency_key,
       r.receipt_id, r.namespace, r.delivery_id, r.accepted_at, f.claim_path
  FROM (SELECT w.work_id, w.registration_id, w.revision, w.work_type, w.queue_class, w.attempts, w.replays,
               w.failure_class, w.failure_summary, w.finished_at, w.event_id, '{WORK_ITEM_PATH}' AS claim_path
          FROM connector_work_items w
          LEFT JOIN workqueue_generations g ON g.registration_id = w.registration_id AND g.revision = w.revision
         WHERE w.state = '{DEAD}' AND g.claim_path IS DISTINCT FROM '{EVENT_PATH}' {{reg_filter}}
           AND w.work_id > %(after)s
        UNION ALL
        SELECT x.work_id, x.registration_id, x.revision, x.work_type, x.queue_class, x.attempts, 0,
               x.failure_class, x.failure_summary, x.finished_at, x.event_id, '{EVENT_PATH}'
          FROM event_executions x
          JOIN workqueue_generations g ON g.registration_id = x.registration_id AND g.revision = x.revision
         WHERE x.state IN {sql_in((FAILED, UNKNOWN))} AND g.claim_path = '{EVENT_PATH}' {{reg_filter}}
           AND x.work_id > %(after)s) f
  JOIN connector_outbox_events e ON e.event_id = f.event_id
  JOIN ingress_receipts r ON r.receipt_id = e.receipt_id
 ORDER BY f.work_id
 LIMIT %(limit)s
"""


def list_dead(
    conn: Connection, *, registration_id: str | None = None, after_work_id: int = 0, limit: int = 50
) -> list[DeadItem]:
    """Failures of each generation from the claim path that owns it."""
    sql = _LIST.format(reg_filter="AND g.registration_id = %(reg)s" if registration_id else "")
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
        # the generation row first, as a claim takes it: a gate changing its owner waits for the replay
        conn.execute(
            """SELECT 1 FROM workqueue_generations g JOIN connector_work_items w
                   ON g.registration_id = w.registration_id AND g.revision = w.revision
                WHERE w.work_id = %s FOR KEY SHARE OF g""",
            (work_id,),
        )
        row = conn.execute(
            """SELECT w.state, w.lease_token, w.registration_id, w.revision,
                      e.route_id, e.route_version, g.status, g.route_versions ->> e.route_id,
                      w.failure_class, w.failure_summary, g.claim_path
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
        (state, token, reg, rev, route_id, route_version, gen_status, bound_version, fclass, summary,
         claim_path) = row
        if state != DEAD:
            raise ReplayRefused(f"work item {work_id} is {state!r}; only dead items can be replayed")
        if gen_status != ACTIVE or claim_path != WORK_ITEM_PATH:
            owner = f"{gen_status or 'not activated'!r}" + (" on the Event path" if claim_path == EVENT_PATH else "")
            raise ReplayRefused(
                f"work item {work_id} belongs to {reg}@{rev}, which is {owner}; "
                "replay needs its generation to be the active WorkItem generation"
            )
        if bound_version is None or int(bound_version) != route_version:
            raise ReplayRefused(
                f"work item {work_id}: route {route_id!r} version {route_version} of its event is not the version "
                f"bound by the activation receipt ({bound_version or 'none'}); replay fails closed"
            )
        (replays,) = conn.execute(
            f"""UPDATE connector_work_items
                  SET state = '{PENDING}', attempts = 0, unstarted_attempts = 0, replays = replays + 1,
                      run_after = now(), outcome = NULL, finished_at = NULL, updated_at = now()
                WHERE work_id = %s AND state = '{DEAD}' AND lease_token IS NOT DISTINCT FROM %s
            RETURNING replays""",
            (work_id, token),
        ).fetchone()
        conn.execute(
            """INSERT INTO workqueue_replays (work_id, requested_by, prior_failure_class, prior_failure_summary)
               VALUES (%s, %s, %s, %s)""",
            (work_id, requested_by, fclass, summary),
        )
    return ReplayResult(work_id, replays, reg, rev)
