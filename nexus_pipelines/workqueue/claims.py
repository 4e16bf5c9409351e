"""Claiming and finalizing work items: batched, compare-and-swap, fenced by token.

Claim: one statement finds candidates through the `connector_work_items_due` index
(only generations whose status is 'active'), locks them with `FOR UPDATE SKIP
LOCKED` and takes them by primary-key compare-and-swap (state and seen token
unchanged), giving each a fresh token from the `workqueue_tokens` sequence (no
cache, so tokens strictly increase), the caller as owner and a lease deadline
computed from the database clock. Attempts are counted at claim time, so an attempt
whose holder dies still counts.

Fencing: `renew`, `complete` and `finalize_failures` (retry / dead) update only rows
whose current token is the caller's, whose state is 'running' and whose lease has not
expired; rows not returned are lost to the caller, which must stop working on them.
`reclaim_expired` moves expired leases back to 'retry' (or to 'dead' once the attempt
budget is spent), guarded by the token it saw.

Lanes:
* Source lane (FIFO): only the lane's head, its lowest unfinished work_id, is
  claimable, and the partial unique index `connector_work_items_source_inflight`
  allows at most one running item per lane. The head check is two index probes: no
  lower pending / retry item of the lane (`connector_work_items_source_lane`, which
  holds only pending and retry rows, so a claim adds no entry to it) and no running
  item of the lane at all (`connector_work_items_source_inflight`). A running item
  of the lane is its head (or a replayed item's successor), so this is the "lowest
  unfinished" rule, and it never picks an item the unique index would reject.
* Target mutation lane: at most one running item per lane, enforced by the partial
  unique index `connector_work_items_target_inflight`; the claim skips lanes with a
  running item and takes at most one candidate per lane.
* Items without a lane key take no part in lane checks.
* Decision: an item waiting to retry ('retry') still holds its source lane (it stays
  the head, so later items of the lane cannot overtake it) but does not hold its
  target lane (the target lane only serializes running mutations; holding it through
  a backoff would stall every other source writing that target). Dead items hold no
  lane. Items of a generation that is not active still hold their source lanes:
  ordering across generations is kept, and such lanes wait (fail closed).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from psycopg import Connection, errors

from nexus_pipelines.workqueue.retry import DEFAULT_POLICY, RetryPolicy, sanitize_summary

class LeaseFlag:
    """Set when the holder has lost the item's lease; `threading.Event`-like, created lazily."""

    __slots__ = ("_event",)
    _create_lock = threading.Lock()

    def __init__(self) -> None:
        self._event: threading.Event | None = None

    def _ensure(self) -> threading.Event:
        if self._event is None:
            with LeaseFlag._create_lock:
                if self._event is None:
                    self._event = threading.Event()
        return self._event

    def is_set(self) -> bool:
        return self._event is not None and self._event.is_set()

    def set(self) -> None:
        self._ensure().set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._ensure().wait(timeout)


@dataclass(frozen=True, slots=True)
class ClaimedItem:
    """A work item held by the caller with `token` until `lease_until` (database clock)."""

    work_id: int
    token: int
    event_id: int
    registration_id: str
    revision: int
    work_type: str
    queue_class: str
    attempts: int
    max_attempts: int
    lease_owner: str
    lease_until: datetime
    source_lane_key: str | None
    target_lane_key: str | None
    payload: Any = None
    lease_lost: LeaseFlag = field(default_factory=LeaseFlag, compare=False, repr=False)

    @property
    def fence(self) -> tuple[int, int]:
        return (self.work_id, self.token)


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt: retry after `delay_s` unless `terminal` or the budget is spent."""

    work_id: int
    token: int
    failure_class: str
    summary: str
    delay_s: float = 0.0
    terminal: bool = False


class LaneRaceLost(list):
    """The (empty) result of a claim that lost a lane race: due work may remain, claim again."""


@dataclass(frozen=True)
class ReclaimReport:
    retried: int
    dead: int


_CLAIM = """
WITH gens AS MATERIALIZED (
    SELECT registration_id, revision
      FROM workqueue_generations
     WHERE status = 'active' {gen_filter}
       FOR KEY SHARE
),
cand AS (
    SELECT c.work_id, c.lease_token, c.registration_id, c.target_lane_key
      FROM gens g
     CROSS JOIN LATERAL (
        SELECT w.work_id, w.lease_token, w.registration_id, w.target_lane_key
          FROM connector_work_items w
         WHERE w.registration_id = g.registration_id
           AND w.revision = g.revision
           AND w.state IN ('pending', 'retry')
           AND w.run_after <= now()
           {class_filter}
           {type_filter}
           -- Lane probes. The OR keeps each probe a subplan (a flattened anti-join would
           -- read every candidate before the LIMIT); the IS NOT NULL terms let the probes
           -- use the partial lane indexes.
           AND (w.source_lane_key IS NULL OR (NOT EXISTS (
                SELECT 1 FROM connector_work_items h
                 WHERE h.registration_id = w.registration_id
                   AND h.source_lane_key = w.source_lane_key
                   AND h.source_lane_key IS NOT NULL
                   AND h.work_id < w.work_id
                   AND h.state IN ('pending', 'retry'))
               AND NOT EXISTS (
                SELECT 1 FROM connector_work_items r
                 WHERE r.registration_id = w.registration_id
                   AND r.source_lane_key = w.source_lane_key
                   AND r.source_lane_key IS NOT NULL
                   AND r.state = 'running')))
           AND (w.target_lane_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM connector_work_items t
                 WHERE t.registration_id = w.registration_id
                   AND t.target_lane_key = w.target_lane_key
                   AND t.target_lane_key IS NOT NULL
                   AND t.state = 'running'))
         ORDER BY w.queue_class, w.run_after, w.work_id
         LIMIT %(scan)s
           FOR UPDATE OF w SKIP LOCKED
     ) c
),
pick AS (
    -- one candidate per target lane, and only lanes whose transaction-scoped try-lock
    -- this claim gets: two claims in flight never insert the same in-flight lane key
    -- (which would make one wait on the other, or deadlock, in the unique index)
    SELECT work_id, lease_token
      FROM (SELECT work_id, lease_token, registration_id, target_lane_key,
                   row_number() OVER (PARTITION BY registration_id, target_lane_key ORDER BY work_id) AS lane_rank
              FROM cand) ranked
     WHERE target_lane_key IS NULL
        OR (lane_rank = 1
            AND pg_try_advisory_xact_lock(hashtextextended(registration_id || '/' || target_lane_key, 7)))
     LIMIT %(limit)s
)
UPDATE connector_work_items w
   SET state = 'running',
       lease_owner = %(owner)s,
       lease_token = nextval('workqueue_tokens'),
       lease_until = now() + %(ttl)s,
       attempts = w.attempts + 1,
       claimed_at = now(),
       updated_at = now()
  FROM pick{payload_from}
 WHERE w.work_id = pick.work_id
   AND w.state IN ('pending', 'retry')
   AND w.lease_token IS NOT DISTINCT FROM pick.lease_token{payload_join}
RETURNING w.work_id, w.lease_token, w.event_id, w.registration_id, w.revision, w.work_type, w.queue_class,
          w.attempts, w.max_attempts, w.lease_owner, w.lease_until, w.source_lane_key, w.target_lane_key{payload_col}
"""


def claim_sql(
    *, queue_classes: bool = False, work_types: bool = False, registrations: bool = False, with_payload: bool = True
) -> str:
    return _CLAIM.format(
        gen_filter="AND registration_id = ANY(%(registrations)s::text[])" if registrations else "",
        class_filter="AND w.queue_class = ANY(%(classes)s::text[])" if queue_classes else "",
        type_filter="AND w.work_type = ANY(%(types)s::text[])" if work_types else "",
        payload_from=", connector_outbox_events e" if with_payload else "",
        payload_join="\n   AND e.event_id = w.event_id" if with_payload else "",
        payload_col=", e.payload" if with_payload else "",
    )


_CLAIM_SQL_CACHE: dict[tuple[bool, bool, bool, bool], str] = {}


def claim_batch(
    conn: Connection,
    *,
    owner: str,
    limit: int,
    lease_ttl: timedelta,
    work_types: Sequence[str] | None = None,
    queue_classes: Sequence[str] | None = None,
    registration_ids: Sequence[str] | None = None,
    with_payload: bool = True,
    scan_factor: int = 1,
) -> list[ClaimedItem]:
    """Claim up to `limit` due items of active generations in one statement.

    Returns an empty `LaneRaceLost` when a concurrent claimer won a lane race (the
    partial unique lane indexes rejected the statement); the caller simply claims
    again (it is not a sign of an idle queue). `scan_factor`
    times `limit` candidates are locked, of which at most `limit` are taken.
    """
    if limit <= 0:
        return []
    key = (queue_classes is not None, work_types is not None, registration_ids is not None, with_payload)
    sql = _CLAIM_SQL_CACHE.get(key)
    if sql is None:
        sql = _CLAIM_SQL_CACHE[key] = claim_sql(
            queue_classes=key[0], work_types=key[1], registrations=key[2], with_payload=with_payload
        )
    params = {
        "owner": owner,
        "ttl": lease_ttl,
        "limit": limit,
        "scan": limit * max(scan_factor, 1),
        "classes": list(queue_classes or ()),
        "types": list(work_types or ()),
        "registrations": list(registration_ids or ()),
    }
    try:
        rows = conn.execute(sql, params, prepare=True).fetchall()
    except (errors.UniqueViolation, errors.DeadlockDetected):
        # a concurrent claim won a lane race the try-locks could not see (it committed
        # between this statement's snapshot and its index insert): claim again
        return LaneRaceLost()
    return [
        ClaimedItem(
            work_id=r[0],
            token=r[1],
            event_id=r[2],
            registration_id=r[3],
            revision=r[4],
            work_type=r[5],
            queue_class=r[6],
            attempts=r[7],
            max_attempts=r[8],
            lease_owner=r[9],
            lease_until=r[10],
            source_lane_key=r[11],
            target_lane_key=r[12],
            payload=r[13] if with_payload else None,
        )
        for r in rows
    ]


def _fence_arrays(fences: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    tokens: list[int] = []
    for work_id, token in sorted(fences):
        ids.append(work_id)
        tokens.append(token)
    return ids, tokens


# Batched fenced statements lock their rows in work_id order first, so two of them
# over overlapping rows (a heartbeat renewing while a batch completes) cannot deadlock.
_HELD = """
WITH held AS (
    SELECT w.work_id
      FROM connector_work_items w
      JOIN unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS d(work_id, token)
        ON w.work_id = d.work_id AND w.lease_token = d.token
     WHERE w.state = 'running' AND w.lease_until > now()
     ORDER BY w.work_id
       FOR NO KEY UPDATE OF w
)
"""

# The hot paths (renew, complete) update directly, with the fences sorted by work_id
# (so rows are taken in work_id order by the usual nested loop over the pkey); callers
# must not run two of them over the same held items at once (a drain serializes its
# heartbeat and its finalization). Failures, a cold path, take the ordered locks.
_RENEW = """
UPDATE connector_work_items w
   SET lease_until = now() + %(ttl)s
  FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS d(work_id, token)
 WHERE w.work_id = d.work_id AND w.lease_token = d.token
   AND w.state = 'running' AND w.lease_until > now()
RETURNING w.work_id
"""

_COMPLETE = """
UPDATE connector_work_items w
   SET state = 'completed',
       outcome = %(outcome)s,
       lease_until = NULL,
       finished_at = now(),
       updated_at = now()
  FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS d(work_id, token)
 WHERE w.work_id = d.work_id AND w.lease_token = d.token
   AND w.state = 'running' AND w.lease_until > now()
RETURNING w.work_id
"""

_FAIL = _HELD + """
UPDATE connector_work_items w
   SET state = CASE WHEN d.terminal OR w.attempts >= w.max_attempts THEN 'dead' ELSE 'retry' END,
       run_after = CASE WHEN d.terminal OR w.attempts >= w.max_attempts THEN w.run_after
                        ELSE now() + make_interval(secs => d.delay_s) END,
       outcome = CASE WHEN d.terminal OR w.attempts >= w.max_attempts THEN 'dead' ELSE NULL END,
       finished_at = CASE WHEN d.terminal OR w.attempts >= w.max_attempts THEN now() ELSE NULL END,
       failure_class = d.failure_class,
       failure_summary = d.summary,
       lease_until = NULL,
       updated_at = now()
  FROM held
  JOIN unnest(%(ids)s::bigint[], %(classes)s::text[], %(summaries)s::text[], %(delays)s::float8[],
              %(terminal)s::boolean[])
       AS d(work_id, failure_class, summary, delay_s, terminal) ON d.work_id = held.work_id
 WHERE w.work_id = held.work_id
RETURNING w.work_id, w.state
"""

_RECLAIM = """
WITH expired AS (
    SELECT work_id, lease_token
      FROM connector_work_items
     WHERE state = 'running' AND lease_owner IS NOT NULL AND lease_until <= now()  -- the lease index
     ORDER BY lease_until
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE connector_work_items w
   SET state = CASE WHEN w.attempts >= w.max_attempts THEN 'dead' ELSE 'retry' END,
       run_after = CASE WHEN w.attempts >= w.max_attempts THEN w.run_after
                        ELSE now() + make_interval(secs =>
                             least(%(cap)s, %(base)s * power(2, greatest(w.attempts - 1, 0)))
                             * (1 - %(jitter)s * random())) END,
       outcome = CASE WHEN w.attempts >= w.max_attempts THEN 'dead' ELSE NULL END,
       finished_at = CASE WHEN w.attempts >= w.max_attempts THEN now() ELSE NULL END,
       failure_class = 'lease_expired',
       failure_summary = format('lease expired before its holder finished (attempt %%s of %%s)',
                                w.attempts, w.max_attempts),
       reclaims = w.reclaims + 1,
       lease_until = NULL,
       updated_at = now()
  FROM expired e
 WHERE w.work_id = e.work_id AND w.lease_token = e.lease_token
   AND w.state = 'running' AND w.lease_until <= now()
RETURNING w.work_id, w.state
"""


def lock_fence(conn: Connection, item: ClaimedItem) -> bool:
    """Lock the item's row if the caller still holds it (token, running, lease unexpired).

    A handler calls this first in the transaction that writes its effects: once it
    returns True no reclaim or other claim can take the item until that transaction
    ends, so a stale holder never writes; False means the lease is lost (write nothing).
    """
    row = conn.execute(
        """SELECT 1 FROM connector_work_items
            WHERE work_id = %s AND lease_token = %s AND state = 'running' AND lease_until > now()
              FOR NO KEY UPDATE""",
        (item.work_id, item.token),
    ).fetchone()
    return row is not None


def renew(conn: Connection, fences: Iterable[tuple[int, int]], lease_ttl: timedelta) -> set[int]:
    """Extend the leases still held; returns the work_ids renewed (the others are lost)."""
    ids, tokens = _fence_arrays(fences)
    if not ids:
        return set()
    rows = conn.execute(_RENEW, {"ids": ids, "tokens": tokens, "ttl": lease_ttl}, prepare=True).fetchall()
    return {r[0] for r in rows}


def complete(conn: Connection, fences: Iterable[tuple[int, int]], *, outcome: str = "succeeded") -> set[int]:
    """Complete every item still held with its token; returns the work_ids completed."""
    ids, tokens = _fence_arrays(fences)
    if not ids:
        return set()
    rows = conn.execute(_COMPLETE, {"ids": ids, "tokens": tokens, "outcome": outcome}, prepare=True).fetchall()
    return {r[0] for r in rows}


def finalize_failures(conn: Connection, failures: Sequence[Failure]) -> dict[int, str]:
    """Record failed attempts (retry with backoff, or dead); returns work_id -> new state.

    Items missing from the result were no longer held with the given token.
    """
    if not failures:
        return {}
    params = {
        "ids": [f.work_id for f in failures],
        "tokens": [f.token for f in failures],
        "classes": [sanitize_summary(f.failure_class, 100) or "error" for f in failures],
        "summaries": [sanitize_summary(f.summary) for f in failures],
        "delays": [max(float(f.delay_s), 0.0) for f in failures],
        "terminal": [bool(f.terminal) for f in failures],
    }
    rows = conn.execute(_FAIL, params, prepare=True).fetchall()
    return {r[0]: r[1] for r in rows}


def retry(
    conn: Connection, item: ClaimedItem, failure_class: str, summary: str, *, policy: RetryPolicy = DEFAULT_POLICY
) -> str | None:
    """Retry one item after the policy's backoff; returns its new state, None when the lease was lost."""
    failure = Failure(item.work_id, item.token, failure_class, summary, policy.delay(item.attempts))
    return finalize_failures(conn, [failure]).get(item.work_id)


def fail(conn: Connection, item: ClaimedItem, failure_class: str, summary: str) -> bool:
    """Dead-letter one item now; False when the lease was lost."""
    return finalize_failures(conn, [Failure(item.work_id, item.token, failure_class, summary, terminal=True)]) != {}


def reclaim_expired(conn: Connection, *, limit: int = 500, policy: RetryPolicy = DEFAULT_POLICY) -> ReclaimReport:
    """Take back expired leases (each counts as an attempt): to 'retry', or 'dead' when spent."""
    rows = conn.execute(
        _RECLAIM,
        {"limit": limit, "base": policy.base_s, "cap": policy.cap_s, "jitter": policy.jitter},
        prepare=True,
    ).fetchall()
    dead = sum(1 for r in rows if r[1] == "dead")
    return ReclaimReport(retried=len(rows) - dead, dead=dead)
