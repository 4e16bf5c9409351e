"""Claiming and finalizing work items: batched, compare-and-swap, fenced by token.

Claim: one statement finds candidates through the `connector_work_items_due` index
(only generations whose status is 'active'), holds them with a transaction-scoped
advisory try-lock each (skipping those another claim holds) and takes the first in claim
order (whichever path found them: see "Parking" and "Behind") by
primary-key compare-and-swap (state and seen token unchanged), giving each a fresh
token from the `workqueue_tokens` sequence (no cache, so tokens strictly increase),
the caller as owner and a lease deadline computed from the database clock. Attempts
are counted at claim time, so an attempt whose holder dies still counts.

Candidate locks: the try-lock does what `FOR UPDATE SKIP LOCKED` did, without its
costs. A row lock is written to the row (one WAL record per candidate), and in READ
COMMITTED a row that another claim took after this claim's snapshot is locked in its
newest version before the recheck rejects it, so a claim also held (and logged) locks
on other drains' running items, whose completions then waited for it. An advisory
lock lives only in the lock manager. Two claims never take the same candidate at once
(the second one's try-lock fails), and a claim that meets a candidate another claim
took and committed skips it at the compare-and-swap (the update rechecks the newest
version: no longer claimable). The key is the work_id as two int4 halves, a lock
space no other advisory lock of the project uses (they take one bigint key).

Fencing: `renew`, `complete` and `finalize_failures` (retry / dead) update only rows
whose current token is the caller's, whose state is 'running' and whose lease has not
expired; rows not returned are lost to the caller, which must stop working on them.
`reclaim_expired` moves expired leases back to 'retry' (or to 'dead' once the attempt
budget is spent), guarded by the token it saw, with the delay of the one retry policy.

No lock cycle: a claim can wait in a lane's unique index for the transaction that is
finishing the lane's running item, and for the generation row while a gate holds it.
It holds no row lock on anyone's running item (see "Candidate locks"), and still never
waits longer than CLAIM_LOCK_BUDGET_MS for any lock (a statement-local
`lock_timeout`): a claim that runs out of it lost a lane race and claims again.
Renewal locks its rows in work_id order and skips rows locked by others (renewed on
the next beat), failures lock theirs in work_id order, reclaims skip locked rows. A
drain retries a fenced statement that still meets a deadlock, serialization or lock
timeout error (`session.py`): each is one autocommit statement, so nothing was written.

Dispatch: a claim counts an attempt (`attempts`); an attempt the drain hands back
before its handler started is counted in `unstarted_attempts` (`release_unstarted`).
So `attempts - unstarted_attempts` attempts may have dispatched (a holder that died
counts as dispatched), which is both the attempt budget and what a rollback fence
reads to tell a pre-dispatch retry from one with a prior dispatch.

Parking: items of a target lane that runs an item wait at the front of the claim order
(others drain past them), so a claim that walked them all on every call slowed every
other lane by a hot lane's backlog. A claim that meets a due item of a busy target lane
with an earlier unparked claimable item parks that lane's backlog: all but its first
unparked item, up to PARK_BATCH items per claim (`parked`: they leave the walk's index,
into one grouped by target lane). The first item stays in the walk, so a lane with one
waiting item is never written, and a busy lane costs a walk one row. Each claim also
looks at the first due item of each parked lane that runs nothing (one probe per parked
lane, whatever its backlog; the lanes in key order from just after the one the process's
last claim reached, round to the first key) and takes it like any candidate, clearing the
flag, in the same statement as the walk (`_CLAIM`, every call): a parked lane frees up
after each of its items, so a statement of its own ran for every item of a hot lane. The
walk reports the busy lanes it met; parking them (`_PARK`) is a statement of its own, run
only then, so the claim keeps a cached plan (the parking's array parameters got every
plan of a statement holding it planned afresh). A parked
item stays pending (its source lane position, counts and gates are unchanged). A claim
that parked or marked items but took none returns `LaneRaceLost`: due work remains. A
lane's backlog beyond WALK_MAX unparked items is parked already when it is enqueued
(`receipts.py`).

Behind: an item behind a claimable item of its source lane cannot run before it (that
item waits for a busy target lane, is parked, retries later, or runs first in this very
claim). Left in the walk, every claim passed over them (a head probe each); with many source
lanes crossing many target lanes they became most of the queue, and a 100,000-item drain
fell from about 14,000 items/s to 164. So the walk counts those it meets in its bound
(`stuck`) and the parking marks them `behind`, and of a busy lane's backlog it parks only
the source lane heads and marks the rest; with them the items after them in their source
lanes, in a busy lane's backlog's lanes and in lanes the walk met more than once
(FOLLOW_DEPTH a lane read, PARK_BATCH marked, the first in claim order). A claim then never
reads past more than its bound of them, plus one item a running item holds (a head whose
lane runs an item, a busy lane's first waiting item). A behind item is in neither the walk's
index nor the parked lanes' one but in one by source lane: each claim looks at the first
behind item of every source lane that has one (one probe per lane, from a random point of
the ring of their key hashes) and takes it once it is the lane's head, due, and its target
lane runs nothing (at most BEHIND_LANES). Taking an item clears both flags and nothing else
writes them, so a completion writes no more.
Every claimable item is in exactly one of the three indexes, and each path takes its items
once they are heads: a lane's head, if behind, is its first behind item, so none is left
where no claim finds it.

Lanes:
* Source lane (FIFO): only the lane's head, its lowest unfinished work_id, is
  claimable, and the partial unique index `connector_work_items_running` (every
  running row, keyed by source lane; NULL keys are distinct) allows at most one
  running item per lane. The head check is two index probes: the lane's first pending /
  retry item is this one (`connector_work_items_source_lane`, which holds only pending and
  retry rows, so a claim adds no entry to it) and no running item of the lane at all
  (`connector_work_items_running`). A running item
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

import json
import random
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from psycopg import Connection, errors

from nexus_pipelines.workqueue.retry import DEFAULT_POLICY, RetryPolicy, sanitize_summary
from nexus_pipelines.workqueue.states import (
    ACTIVE,
    CLAIMABLE,
    COMPLETED,
    DEAD,
    EVENT_PATH,
    RETRY,
    ROLLING_BACK,
    RUNNING,
    STARTED,
    WORK_ITEM_PATH,
    sql_in,
)

# Longest a claim statement waits for any lock (gate locks, lane index checks); well
# below deadlock_timeout (1 s by default), so a claim never stays in a lock cycle.
CLAIM_LOCK_BUDGET_MS = 50

# Most advisory locks one claim holds until it commits: a try-lock per candidate and one
# per target lane it takes (at most one per candidate). They live in the lock table every
# session shares (max_locks_per_transaction x connections), so a claim takes at most half
# this many candidates of each active generation it walks, whatever its batch (a drain
# claims the rest next time; the walk is bounded per generation, docs/design/work-queue.md).
CLAIM_MAX_LOCKS = 600

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
    # the event payload's JSON text as the database returns it (None: claimed without payloads),
    # so a handler that validates it from JSON reads it once
    payload_json: str | None = None
    lease_lost: LeaseFlag = field(default_factory=LeaseFlag, compare=False, repr=False)
    # 'event' when the Event path runs it: `token` is then the scheduler lease's token
    claim_path: str = WORK_ITEM_PATH

    @property
    def fence(self) -> tuple[int, int]:
        return (self.work_id, self.token)

    @property
    def payload(self) -> Any:
        """The event payload, parsed from `payload_json` on each access."""
        return None if self.payload_json is None else json.loads(self.payload_json)


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt: retry after `delay_s` unless `terminal` or the budget is spent.
    An `uncounted` attempt sent nothing (a provider's wait held it): it is counted as
    unstarted, so it spends none of the budget."""

    work_id: int
    token: int
    failure_class: str
    summary: str
    delay_s: float = 0.0
    terminal: bool = False
    uncounted: bool = False


class LaneRaceLost(list):
    """The (empty) result of a claim that lost a lane race: due work may remain, claim again."""


@dataclass(frozen=True)
class ReclaimReport:
    retried: int
    dead: int


# Most items of one busy target lane a claim parks, and most items behind them in their
# source lanes it marks (one statement's writes stay bounded); most candidates it takes from
# parked lanes, and from source lanes' behind items.
PARK_BATCH = 2000
PARKED_LANES = 50
BEHIND_LANES = 50
# Most items after one marked item a parking reads in its source lane.
FOLLOW_DEPTH = 100
# Most items one claim's walk visits: the rest of the lock cap.
WALK_MAX = CLAIM_MAX_LOCKS // 2 - PARKED_LANES - BEHIND_LANES

_CANDIDATE_LOCK = "pg_try_advisory_xact_lock(({a}.work_id >> 31)::int, ({a}.work_id & 2147483647)::int)"
# A target lane's try-lock: held by the claim taking the lane's item, or parking its backlog.
_LANE_LOCK = "pg_try_advisory_xact_lock(hashtextextended({a}.registration_id || '/' || {a}.target_lane_key, 7))"

# Lane probes of a due item `w`. The OR keeps each probe a subplan (a flattened anti-join
# would read every candidate before the LIMIT); the IS NOT NULL terms let the probes use
# the partial lane indexes. "No lower claimable item in the lane" is asked as "the lane's
# first claimable item is `w`" (w is one of them): ordered by work_id, only the lane index
# answers it without a sort, whatever the statistics. As a `work_id <` range, the due index
# (registration first) cost the same under the one-row estimates of tables analyzed empty
# or never, and the tie went to the index created last: 0027 re-created the due index, and
# the cached plan then read the registration's due items below `w` in every probe. The
# comparison is `>=` (the same answer: the first is never above `w`): the planner gives an
# `=` against a subquery 0.5% of the rows, so on an analyzed full queue the walk's LIMIT
# looked out of reach and it read and sorted every due item (a probe each) instead of
# reading the due index in claim order; an inequality gets a third.
_LANE_FIRST = f"""(
                SELECT h.work_id FROM connector_work_items h
                 WHERE h.registration_id = w.registration_id
                   AND h.source_lane_key = w.source_lane_key
                   AND h.source_lane_key IS NOT NULL
                   AND h.state IN {sql_in(CLAIMABLE)}
                 ORDER BY h.work_id LIMIT 1)"""
# No running item in the source lane of `{w}`.
_LANE_IDLE = f"""NOT EXISTS (
                SELECT 1 FROM connector_work_items r
                 WHERE r.registration_id = {{w}}.registration_id
                   AND r.source_lane_key = {{w}}.source_lane_key
                   AND r.state = '{RUNNING}' AND r.lease_owner IS NOT NULL)"""
_SOURCE_HEAD = f"""(w.source_lane_key IS NULL OR ({_LANE_FIRST} >= w.work_id
               AND {_LANE_IDLE.format(w="w")}))"""

# Due items `w` of the claim (the class and type filters are filled in per call), and the
# claim order.
_DUE = """AND w.run_after <= now()
           {class_filter}
           {type_filter}"""
_CLAIM_ORDER = "ORDER BY w.queue_class, w.run_after, w.work_id"
# The claimable source lane heads of a walk over `w`, in claim order.
_DUE_HEAD = f"""{_DUE}
           AND {_SOURCE_HEAD}"""
_DUE_HEADS = f"""AND w.state IN {sql_in(CLAIMABLE)}
           {_DUE_HEAD}
         {_CLAIM_ORDER}"""

def _target_busy(registration: str, lane: str) -> str:
    return f"""EXISTS (
                SELECT 1 FROM connector_work_items t
                 WHERE t.registration_id = {registration}
                   AND t.target_lane_key = {lane}
                   AND t.target_lane_key IS NOT NULL
                   AND t.state = '{RUNNING}')"""


_CLAIMABLE_GENERATION = f"g.status = '{ACTIVE}' AND g.claim_path = '{WORK_ITEM_PATH}'"

# The active WorkItem-owned generations a statement walks, read first so that the lock
# budget is set before anything can wait. Locked (`lock`) by a statement that writes
# whatever it meets (the parking); the claim locks only those it takes from (`held`).
_GENS = f"""gens AS MATERIALIZED (
    SELECT g.registration_id, g.revision
      FROM (SELECT set_config('lock_timeout', '{CLAIM_LOCK_BUDGET_MS}', true)) budget,
           workqueue_generations g
     WHERE {_CLAIMABLE_GENERATION} {{gen_filter}}
     {{lock}}
)"""

# What each candidate of a claim carries, from whichever path found it: its key and fence, its
# generation and target lane, and its place in the claim order.
_CANDIDATE_COLUMNS = ("work_id", "lease_token", "state", "registration_id", "revision", "target_lane_key",
                      "queue_class", "run_after")


def _candidate(alias: str | None = None) -> str:
    """The candidate columns, as a select list (of `alias`'s, when given)."""
    return ", ".join(f"{alias}.{c}" if alias else c for c in _CANDIDATE_COLUMNS)


# The claim's candidates `cand`, one per target lane taken, compared and set.
_TAKE = f"""pick AS (
    -- one candidate per target lane, the first in claim order whichever path found it (taken
    -- in the window's order, by target lane key, the items of no target lane came last and
    -- waited while parked lanes had heads to give), and only lanes whose transaction-scoped
    -- try-lock this claim gets: two claims in flight never insert the same in-flight lane key
    -- (which would make one wait on the other in the unique index). OFFSET 0: the try-lock
    -- runs on candidates in that order, only until the LIMIT
    SELECT work_id, lease_token, state, registration_id, revision
      FROM (SELECT * FROM (
            SELECT {_candidate()},
                   row_number() OVER (PARTITION BY registration_id, target_lane_key
                                      ORDER BY queue_class, run_after, work_id) AS lane_rank
              FROM cand) ranked
             WHERE target_lane_key IS NULL OR lane_rank = 1
             ORDER BY queue_class, run_after, work_id
            OFFSET 0) ordered
     WHERE target_lane_key IS NULL OR {_LANE_LOCK.format(a="ordered")}
     LIMIT %(limit)s
),
held AS MATERIALIZED (
    -- the generation gate: FOR KEY SHARE on the rows of the generations this claim takes
    -- from, so a gate's FOR UPDATE waits for the claim, and a gate that committed first
    -- leaves its generation out on the recheck of the locked row (nothing is taken from
    -- it). Only rows joined to a pick are locked: a claim that takes nothing writes nothing
    -- (a row lock is a WAL record, a multixact once claims overlap, and a commit record)
    SELECT g.registration_id, g.revision
      FROM workqueue_generations g
     WHERE {_CLAIMABLE_GENERATION}
       AND (g.registration_id, g.revision) IN (SELECT registration_id, revision FROM pick)
       FOR KEY SHARE OF g
),
taken AS (
    UPDATE connector_work_items w
       SET state = '{RUNNING}',
           lease_owner = %(owner)s,
           lease_token = nextval('workqueue_tokens'),
           lease_until = now() + %(ttl)s,
           attempts = w.attempts + 1,
           parked = false,
           behind = false,
           claimed_at = now(),
           updated_at = now()
      FROM pick
      JOIN held ON held.registration_id = pick.registration_id AND held.revision = pick.revision{{payload_from}}
     -- the compare-and-swap: the state and token the candidate was seen with. Compared with
     -- the seen state, not with a constant list: a constant `state IN (...)` lets the planner
     -- drive the update from the due index (every due item, once per pick) when statistics
     -- taken while the queue was empty say it holds one row
     WHERE w.work_id = pick.work_id
       AND w.state = pick.state
       AND w.lease_token IS NOT DISTINCT FROM pick.lease_token{{payload_join}}
    RETURNING w.work_id, w.lease_token, w.event_id, w.registration_id, w.revision, w.work_type, w.queue_class,
              w.attempts, w.max_attempts, w.lease_owner, w.lease_until, w.source_lane_key, w.target_lane_key{{payload_col}}
)"""

# The parked target lanes of each generation in key order, from just after the lane the
# claiming process last reached (`parked_after`) round to it: `lanes_after`, then `lanes_upto`.
# Read from the first key, a claim stops at PARKED_LANES free lanes, so the lanes first in key
# order were served on every claim while they had parked items and the others waited. One
# index probe per lane, a `min()` (a ring of key hashes, as the behind lanes have, needs an
# `ORDER BY ... LIMIT 1` probe, which the planner costed the same as a bitmap scan and sort of
# the generation's whole parked index when the statistics showed it nearly empty, and took),
# read only as far as a statement reads them. Then the ones whose target lane runs nothing
# (the busy check as a scalar subquery: one probe per parked lane, where an EXISTS would
# become a join reading every running item).
_PARKED_HOLDS = f"p.parked AND NOT p.behind AND p.state IN {sql_in(CLAIMABLE)}"

# The parked lane each claim filter's last claim in this process reached: the next reads the
# parked lanes from just after it, so successive claims go round them (a new process starts at
# the first key; an entry a thread overwrites with a racing claim's is as good a start).
_PARKED_REACHED: dict[tuple[str, ...], str] = {}


def _parked_arc(name: str, first: str, bound: str) -> str:
    lane = f"""(SELECT min(p.target_lane_key) FROM connector_work_items p
             WHERE p.registration_id = {{r}}.registration_id AND p.revision = {{r}}.revision
               AND {_PARKED_HOLDS} AND {{after}} AND {bound})"""
    return f"""{name} AS (
    SELECT g.registration_id, g.revision, {lane.format(r="g", after=first)} AS lane
      FROM gens g
    UNION ALL
    SELECT l.registration_id, l.revision, {lane.format(r="l", after="p.target_lane_key > l.lane")}
      FROM {name} l
     WHERE l.lane IS NOT NULL
)"""


_PARKED_LANES = (_parked_arc("lanes_after", "p.target_lane_key > %(parked_after)s", "true") + ",\n"
                 + _parked_arc("lanes_upto", "true", "p.target_lane_key <= %(parked_after)s") + f""",
free_lanes AS (
    SELECT registration_id, revision, lane
      FROM (SELECT registration_id, revision, lane FROM lanes_after
            UNION ALL
            SELECT registration_id, revision, lane FROM lanes_upto OFFSET 0) ring
     WHERE lane IS NOT NULL AND NOT (SELECT {_target_busy("ring.registration_id", "ring.lane")})
)""")

# The behind index orders lanes by this hash of their key (see `_BEHIND_LANES`).
_LANE_HASH = "hashtextextended(b.source_lane_key, 0)"


def _behind_lanes(name: str, seed: str, arc: str) -> str:
    """The source lanes holding behind items whose key hash is on one arc of the hash ring, in
    ring order, one index probe per lane, read only as far as a statement reads them."""
    lane = f"""SELECT {_LANE_HASH} AS h, b.source_lane_key AS lane
                 FROM connector_work_items b
                WHERE b.registration_id = {{r}}.registration_id
                  AND b.behind AND b.state IN {sql_in(CLAIMABLE)}
                  AND {{after}} AND {arc}
                ORDER BY {_LANE_HASH}, b.source_lane_key LIMIT 1"""
    return f"""{name} AS (
    SELECT g.registration_id, g.revision, n.h, n.lane
      FROM gens g
     CROSS JOIN LATERAL ({lane.format(r="g", after=seed)}) n
    UNION ALL
    SELECT l.registration_id, l.revision, n.h, n.lane
      FROM {name} l
     CROSS JOIN LATERAL ({lane.format(r="l", after=f"({_LANE_HASH}, b.source_lane_key) > (l.h, l.lane)")}) n
)"""


# The lanes with behind items, from a random point of the ring of their key hashes and on round
# it (a fresh start each claim): read in key order, a claim stops at BEHIND_LANES, so under a
# sustained load the lanes first in key order were always served and the others waited.
_BEHIND_LANES = (_behind_lanes("behind_on", f"{_LANE_HASH} >= %(behind_start)s", "true") + ",\n"
                 + _behind_lanes("behind_round", "true", f"{_LANE_HASH} < %(behind_start)s"))

# The claim: the walk, the heads of the parked lanes that run nothing, and the source lanes'
# behind items that are their lanes' heads now (see "Parking" and "Behind").
_CLAIM = f"""
WITH RECURSIVE {_GENS},
walk AS (
    -- unparked due items in claim order that are source lane heads: the ones this claim
    -- can take, each held by its try-lock (see "Candidate locks"), and the ones to park
    -- (`blocked`: their target lane is busy and has an earlier claimable item); and the
    -- items behind a claimable item of their source lane, to mark behind (`stuck`, see
    -- "Behind"): counted in the walk's bound, so a claim never reads past more of them
    SELECT {_candidate("c")}, c.blocked, c.stuck
      FROM gens g
     CROSS JOIN LATERAL (SELECT * FROM (
      SELECT {_candidate("f")}, f.blocked, f.stuck
        FROM (
        SELECT {_candidate("s")}, s.stuck,
               (NOT s.stuck AND s.target_lane_key IS NOT NULL
                AND {_target_busy("s.registration_id", "s.target_lane_key")}) AS blocked
          FROM (
          SELECT d.*, (d.source_lane_key IS NOT NULL AND d.lane_first < d.work_id) AS stuck
            FROM (
            SELECT {_candidate("w")},
                   w.source_lane_key, {_LANE_FIRST} AS lane_first
              FROM connector_work_items w
             WHERE w.registration_id = g.registration_id
               AND w.revision = g.revision
               AND NOT w.parked
               AND NOT w.behind
               AND w.state IN {sql_in(CLAIMABLE)}
               {_DUE}
             {_CLAIM_ORDER}
            OFFSET 0) d
          -- OFFSET 0: the lane's first item is read once a row. A head whose lane runs an
          -- item is passed over (at most one a running item); every other item is a head or
          -- stuck
          WHERE d.source_lane_key IS NULL OR d.lane_first < d.work_id OR {_LANE_IDLE.format(w="d")}
          OFFSET 0) s
        OFFSET 0) f
       -- OFFSET 0 keeps the try-lock out of the scan's filter, so it runs only on rows that
       -- passed the lane probes (the planner would evaluate the cheap lock before the probes)
       WHERE CASE WHEN f.stuck THEN true
                  WHEN f.blocked THEN EXISTS (
                SELECT 1 FROM connector_work_items e
                 WHERE e.registration_id = f.registration_id
                   AND e.target_lane_key = f.target_lane_key
                   AND e.work_id < f.work_id
                   AND e.state IN {sql_in(CLAIMABLE)} AND NOT e.parked AND NOT e.behind)
             ELSE {_CANDIDATE_LOCK.format(a="f")} END
       -- the constant bound is what the planner costs the walk by: under a parameter
       -- alone it assumes a tenth of the due items, which made a cached generic plan look
       -- dearer than a custom one and got the claim planned afresh on every call
       LIMIT {WALK_MAX}) capped
       LIMIT %(scan)s
     ) c
),
{_PARKED_LANES},
parked_heads AS (
    -- the first parked item of each parked lane that runs nothing, if it is due and its
    -- source lane's head
    SELECT {_candidate("c")}
      FROM (SELECT registration_id, revision, lane FROM free_lanes OFFSET 0) l
     CROSS JOIN LATERAL (
      SELECT {_candidate("f")}
        FROM (
        SELECT {_candidate("w")}
          FROM connector_work_items w
         WHERE w.registration_id = l.registration_id
           AND w.revision = l.revision
           AND w.target_lane_key = l.lane
           AND w.parked
           AND NOT w.behind
           {_DUE_HEADS}
        OFFSET 0) f
       WHERE {_CANDIDATE_LOCK.format(a="f")}
       LIMIT 1
     ) c
     LIMIT {PARKED_LANES}
),
{_BEHIND_LANES},
behind_heads AS (
    -- the first behind item of each source lane that has one, if it is due, the lane's head
    -- now, and its target lane runs nothing (the lane's later behind items wait for it)
    SELECT {_candidate("c")}
      FROM (SELECT registration_id, revision, h, lane FROM behind_on
            UNION ALL
            SELECT registration_id, revision, h, lane FROM behind_round OFFSET 0) l
     CROSS JOIN LATERAL (
      SELECT {_candidate("f")}
        FROM (
        SELECT {_candidate("w")}
          FROM (SELECT b.work_id FROM connector_work_items b
                 WHERE b.registration_id = l.registration_id
                   AND {_LANE_HASH} = l.h
                   AND b.source_lane_key = l.lane
                   AND b.behind AND b.state IN {sql_in(CLAIMABLE)}
                 -- in the lane's order as only the behind index keeps it (by work_id alone,
                 -- the primary key would do, read from the start and filtered)
                 ORDER BY {_LANE_HASH}, b.source_lane_key, b.work_id LIMIT 1) first
          JOIN connector_work_items w ON w.work_id = first.work_id
         -- its state is claimable (the behind index holds no other) and is not restated: as
         -- `state IN (...)`, the due index matched the join too, and a generic plan read it
         -- for every lane instead of finding the item by its primary key
         WHERE w.revision = l.revision
           AND NOT (w.target_lane_key IS NOT NULL AND {_target_busy("w.registration_id", "w.target_lane_key")})
           {_DUE_HEAD}
        OFFSET 0) f
       WHERE {_CANDIDATE_LOCK.format(a="f")}
     ) c
     LIMIT {BEHIND_LANES}
),
cand AS (
    SELECT {_candidate()} FROM parked_heads
    UNION ALL
    SELECT {_candidate()} FROM behind_heads
    UNION ALL
    SELECT {_candidate()} FROM walk
     WHERE NOT blocked AND NOT stuck
),
{_TAKE}
-- one row at least: the items taken, the busy lanes to park, the stuck items to mark and the
-- parked lane this claim reached (of the parked lanes it took an item of, the last in the
-- order it read them: after `parked_after`, then from the first key), where the next starts
SELECT taken.*, busy.registrations, busy.lanes, busy.stuck, busy.parked_reached
  FROM (SELECT array_agg(b.registration_id) AS registrations, array_agg(b.target_lane_key) AS lanes,
               (SELECT array_agg(work_id) FROM walk WHERE stuck) AS stuck,
               (SELECT h.target_lane_key FROM parked_heads h JOIN taken t ON t.work_id = h.work_id
                 ORDER BY h.target_lane_key <= %(parked_after)s DESC, h.target_lane_key DESC
                 LIMIT 1) AS parked_reached
          FROM (SELECT DISTINCT registration_id, target_lane_key FROM walk WHERE blocked) b) busy
  LEFT JOIN taken ON true
"""

# The state recheck of an update driven by keys, as an expression no partial index's predicate
# matches: as `state IN (...)`, the due index (partial on it, its flags among the keys)
# matched the update too, and on a table never analyzed it read that whole index.
_STILL_CLAIMABLE = f"array_position(ARRAY{list(CLAIMABLE)}::text[], w.state) IS NOT NULL"

# Run only after a claim's walk met busy lanes with a backlog or stuck items: parks the
# lanes and marks the items behind (see "Behind"), takes nothing. A
# statement of its own: its array parameters make every plan of it a custom one, which the
# claim every call runs need not share.
_PARK = f"""
WITH {_GENS},
backlog AS MATERIALIZED (
    -- the backlog of each busy lane the walk met leaves the walk, up to PARK_BATCH items
    -- of a lane per claim (its first unparked item stays). Only lanes whose try-lock this
    -- claim gets: claims that met the same lane skip it instead of waiting for each
    -- other's row locks (a lock per busy lane: the walk row that reported the lane took no
    -- candidate locks, so the lock cap holds). Joined to `gens`, so the lock budget is set
    -- before the updates can wait for a row (unjoined, they ran first and waited unbounded).
    -- Each is parked if it is its source lane's head, else it is behind (below). With them
    -- the stuck items the walk met (by key), to mark behind.
    SELECT e.work_id, e.registration_id, e.source_lane_key, e.head, true AS busy
      FROM (SELECT busy.* FROM unnest(%(busy_registrations)s::text[], %(busy_lanes)s::text[])
                               AS busy(registration_id, target_lane_key)
              JOIN gens g ON g.registration_id = busy.registration_id
             WHERE {_LANE_LOCK.format(a="busy")}
            OFFSET 0) lane
     CROSS JOIN LATERAL (
        SELECT w.work_id, w.registration_id, w.source_lane_key, {_SOURCE_HEAD} AS head
          FROM connector_work_items w
         WHERE w.registration_id = lane.registration_id
           AND w.target_lane_key = lane.target_lane_key
           AND w.state IN {sql_in(CLAIMABLE)} AND NOT w.parked AND NOT w.behind
         ORDER BY w.work_id
        OFFSET 1 LIMIT {PARK_BATCH}) e
    UNION ALL
    SELECT w.work_id, w.registration_id, w.source_lane_key, false, false
      FROM connector_work_items w
      JOIN gens g ON g.registration_id = w.registration_id AND g.revision = w.revision
     WHERE w.work_id = ANY (%(stuck)s::bigint[])
),
park AS (
    -- by key (an array, so the update is driven by the primary key); items that were taken
    -- or parked since they were seen are skipped
    UPDATE connector_work_items w
       SET parked = true
     WHERE w.work_id = ANY (ARRAY(SELECT work_id FROM backlog WHERE head))
       AND {_STILL_CLAIMABLE}
       AND NOT w.parked
    RETURNING 1
),
follow AS (
    -- the backlog's items that are not their source lane's head, the stuck items, and the
    -- items after them in their source lanes: none can run before an item ahead of it in its
    -- lane. The items after them only in the lanes of a busy lane's backlog, and in a lane the
    -- walk met more than once (a deep lane at the front of the claim order): a lane met once
    -- mostly waits a moment for a busy target lane, and marking its whole lane marked most of
    -- a queue of crossing lanes (the 20,000-item bench then wrote 1,026 B of WAL an item, not
    -- 900). Of those at most FOLLOW_DEPTH a lane are read and PARK_BATCH marked, the first in
    -- claim order: the ones the walk would meet next. No row is one the park above writes (no
    -- row is updated twice in one statement).
    UPDATE connector_work_items w
       SET behind = true
     WHERE w.work_id = ANY (ARRAY(
            SELECT work_id FROM backlog WHERE NOT head
            UNION
            (SELECT f.work_id
               FROM (SELECT registration_id, source_lane_key, min(work_id) AS first FROM backlog
                      WHERE source_lane_key IS NOT NULL
                      GROUP BY registration_id, source_lane_key
                      HAVING bool_or(busy) OR count(*) > 1) s
              CROSS JOIN LATERAL (
                 SELECT f.work_id FROM connector_work_items f
                  WHERE f.registration_id = s.registration_id
                    AND f.source_lane_key = s.source_lane_key
                    AND f.source_lane_key IS NOT NULL
                    AND f.state IN {sql_in(CLAIMABLE)}
                    AND f.work_id > s.first
                  ORDER BY f.work_id
                  LIMIT {FOLLOW_DEPTH}) f
              ORDER BY f.work_id
              LIMIT {PARK_BATCH})
            -- a stuck item may have become its lane's head since the walk met it
            EXCEPT
            SELECT work_id FROM backlog WHERE head))
       AND {_STILL_CLAIMABLE}
       AND NOT w.behind
    RETURNING 1
)
SELECT (SELECT count(*) FROM park) + (SELECT count(*) FROM follow)
"""


_CLAIM_PARTS = {"walk": _CLAIM, "park": _PARK}

# The work type test as a filter the walk's index scan applies, never an index condition of its
# own: as `work_type = ANY(...)`, statistics that had not yet seen a type (its first burst,
# analyzed before it arrived) made the type look like a row or two, and the planner drove the
# walk from the (event_id, work_type) unique index (a skip scan over event ids), reading and
# sorting every item of the type on every claim, finished or not.
_TYPE_FILTER = "AND array_position(%(types)s::text[], w.work_type) IS NOT NULL"


def claim_sql(
    *, queue_classes: bool = False, work_types: bool = False, registrations: bool = False, with_payload: bool = True,
    part: str = "walk",
) -> str:
    """A claim statement: the claim every call runs (`walk`), or the parking of the busy lanes
    its walk met (`park`; see "Parking")."""
    return _CLAIM_PARTS[part].format(
        lock="FOR KEY SHARE OF g" if part == "park" else "",
        gen_filter="AND g.registration_id = ANY(%(registrations)s::text[])" if registrations else "",
        class_filter="AND w.queue_class = ANY(%(classes)s::text[])" if queue_classes else "",
        type_filter=_TYPE_FILTER if work_types else "",
        payload_from=", connector_outbox_events e" if with_payload else "",
        payload_join="\n   AND e.event_id = w.event_id" if with_payload else "",
        payload_col=", e.payload::text" if with_payload else "",
    )


_CLAIM_SQL_CACHE: dict[tuple[bool, bool, bool, bool, str], str] = {}

# A claim that meets one of these lost a race for a lane (or ran out of its lock budget
# waiting for one): it wrote nothing, and due work may remain.
_LANE_RACE_ERRORS = (errors.UniqueViolation, errors.DeadlockDetected, errors.LockNotAvailable)


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
    """Claim up to `limit` due items of active WorkItem-owned generations.

    One statement walks the items neither parked nor behind and takes them with the parked
    lanes' heads and the source lanes' first behind items; only when its walk met a busy lane
    to park or items to mark behind, a second one (its own transaction, or a savepoint in the
    caller's) parks and marks them.
    Returns an empty `LaneRaceLost` when a concurrent claimer won a lane race (the
    partial unique lane indexes rejected a statement, or it ran out of its lock
    budget), or when it took nothing but parked or marked items; the caller simply
    claims again (it is not a sign of an idle queue). The walk visits `scan_factor` times
    `limit` items, the parked and the behind lanes give at most PARKED_LANES and
    BEHIND_LANES more candidates, of which at most `limit` are taken; all are capped so that
    the claim's locks stay within CLAIM_MAX_LOCKS (two per candidate: its own and its target
    lane's).
    """
    if limit <= 0:
        return []
    scan = min(limit * max(scan_factor, 1), WALK_MAX)
    limit = min(limit, scan)
    parked_key = tuple(registration_ids or ())
    params = {
        "owner": owner,
        "ttl": lease_ttl,
        "limit": limit,
        "scan": scan,
        "classes": list(queue_classes or ()),
        "types": list(work_types or ()),
        "registrations": list(registration_ids or ()),
        "behind_start": random.getrandbits(64) - 2**63,  # a point of the lanes' hash ring
        "parked_after": _PARKED_REACHED.get(parked_key, ""),
    }
    filters = (queue_classes is not None, work_types is not None, registration_ids is not None, with_payload)
    try:
        rows = conn.execute(_claim_statement(*filters, part="walk"), params, prepare=True).fetchall()
    except _LANE_RACE_ERRORS:
        return LaneRaceLost()
    busy_registrations, busy_lanes, stuck, parked_reached = rows[0][-4:]
    if parked_reached is not None:
        _PARKED_REACHED[parked_key] = parked_reached
    items = _claimed(rows, with_payload)
    if not busy_lanes and not stuck:
        return items
    try:
        with conn.transaction():
            (parked,) = conn.execute(_claim_statement(*filters, part="park"),
                                     {**params, "busy_registrations": busy_registrations, "busy_lanes": busy_lanes,
                                      "stuck": stuck},
                                     prepare=True).fetchone()
    except _LANE_RACE_ERRORS:
        parked = None  # lost a lane race: due work remains
    return items if items or parked == 0 else LaneRaceLost()


def _claim_statement(queue_classes: bool, work_types: bool, registrations: bool, with_payload: bool, *, part: str) -> str:
    key = (queue_classes, work_types, registrations, with_payload, part)
    sql = _CLAIM_SQL_CACHE.get(key)
    if sql is None:
        sql = _CLAIM_SQL_CACHE[key] = claim_sql(
            queue_classes=queue_classes, work_types=work_types, registrations=registrations,
            with_payload=with_payload, part=part,
        )
    return sql


def _claimed(rows: list[tuple], with_payload: bool) -> list[ClaimedItem]:
    """The items a claim statement took (a row without an item: it took none)."""
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
            payload_json=r[13] if with_payload else None,
        )
        for r in rows
        if r[0] is not None
    ]


def _fence_arrays(fences: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    tokens: list[int] = []
    for work_id, token in sorted(fences):
        ids.append(work_id)
        tokens.append(token)
    return ids, tokens


def _held(lease: str, wait: str = "") -> str:
    """Rows still held with their fences, locked in work_id order (the one global order). Fence
    arrays go in binary (`%b`), as receipts.py says why."""
    return f"""
WITH held AS (
    SELECT w.work_id
      FROM connector_work_items w
      JOIN unnest(%(ids)b::bigint[], %(tokens)b::bigint[]) AS d(work_id, token)
        ON w.work_id = d.work_id AND w.lease_token = d.token
     WHERE w.state = '{RUNNING}' AND {lease}
     ORDER BY w.work_id
       FOR NO KEY UPDATE OF w {wait}
)
"""


_UNEXPIRED = "w.lease_until > now()"
_EXPIRED = "w.lease_owner IS NOT NULL AND w.lease_until <= now()"

# Renewal never waits: a row locked by someone else (a handler writing its effects under
# lock_fence) keeps its lease until the next beat renews it.
_RENEW = _held(_UNEXPIRED, "SKIP LOCKED") + """
UPDATE connector_work_items w
   SET lease_until = now() + %(ttl)s
  FROM held
 WHERE w.work_id = held.work_id
RETURNING w.work_id
"""

# The hot path updates directly, with the fences sorted by work_id (so rows are taken in
# work_id order by the usual nested loop over the pkey); callers must not run two of
# them over the same held items at once (a drain serializes its heartbeat and its
# finalization). It may wait for a claim holding one of its rows, never for long: see
# CLAIM_LOCK_BUDGET_MS.
_COMPLETE = f"""
UPDATE connector_work_items w
   SET state = '{COMPLETED}',
       outcome = %(outcome)s,
       lease_until = NULL,
       finished_at = now(),
       updated_at = now()
  FROM unnest(%(ids)b::bigint[], %(tokens)b::bigint[]) AS d(work_id, token)
 WHERE w.work_id = d.work_id AND w.lease_token = d.token
   AND w.state = '{RUNNING}' AND w.lease_until > now()
RETURNING w.work_id
"""

# One failed attempt each: retry after its delay, or dead when terminal or when the
# attempts that may have dispatched have spent the budget. Used for handler failures
# (lease held) and for reclaims (lease expired, counted as a reclaim).
_SPENT = "(d.terminal OR (NOT d.uncounted AND w.attempts - w.unstarted_attempts >= w.max_attempts))"
_FAILURES = """
UPDATE connector_work_items w
   SET state = CASE WHEN {spent} THEN '{dead}' ELSE '{retry}' END,
       run_after = CASE WHEN {spent} THEN w.run_after ELSE now() + make_interval(secs => d.delay_s) END,
       outcome = CASE WHEN {spent} THEN '{dead}' ELSE NULL END,
       finished_at = CASE WHEN {spent} THEN now() ELSE NULL END,
       failure_class = d.failure_class,
       failure_summary = d.summary,
       reclaims = w.reclaims + {reclaimed},
       unstarted_attempts = w.unstarted_attempts + d.uncounted::int,
       lease_until = NULL,
       updated_at = now()
  FROM held
  JOIN unnest(%(ids)b::bigint[], %(classes)s::text[], %(summaries)s::text[], %(delays)s::float8[],
              %(terminal)s::boolean[], %(uncounted)s::boolean[])
       AS d(work_id, failure_class, summary, delay_s, terminal, uncounted) ON d.work_id = held.work_id
 WHERE w.work_id = held.work_id
RETURNING w.work_id, w.state
"""
_FAIL = _held(_UNEXPIRED) + _FAILURES.format(spent=_SPENT, dead=DEAD, retry=RETRY, reclaimed=0)
_RECLAIM = _held(_EXPIRED) + _FAILURES.format(spent=_SPENT, dead=DEAD, retry=RETRY, reclaimed=1)

# Expired leases of generations that admit reclaims: a generation whose claims a
# rollback disabled keeps them (they block its fence). The generation rows are locked
# like a claim locks them, so a gate that locks them sees no reclaim in flight.
_EXPIRED_LEASES = f"""
SELECT w.work_id, w.lease_token, w.attempts, w.max_attempts
  FROM connector_work_items w
  JOIN workqueue_generations g ON g.registration_id = w.registration_id AND g.revision = w.revision
 WHERE w.state = '{RUNNING}' AND {_EXPIRED}  -- the running-rows index
   AND g.claim_path = '{WORK_ITEM_PATH}' AND g.status <> '{ROLLING_BACK}'
 ORDER BY w.work_id
 LIMIT %(limit)s
   FOR UPDATE OF w SKIP LOCKED
   FOR KEY SHARE OF g
"""

# An attempt handed back before its handler started: counted as unstarted, and out of
# 'running' (still the caller's token; a reclaim may have moved it first, then only the
# count is added). Once per attempt: the drain hands back each claim at most once.
_RELEASE_UNSTARTED = f"""
UPDATE connector_work_items w
   SET unstarted_attempts = w.unstarted_attempts + 1,
       state = CASE WHEN w.state = '{RUNNING}' THEN '{RETRY}' ELSE w.state END,
       run_after = CASE WHEN w.state = '{RUNNING}' THEN now() ELSE w.run_after END,
       failure_class = CASE WHEN w.state = '{RUNNING}' THEN 'not_started' ELSE w.failure_class END,
       lease_until = NULL,
       updated_at = now()
  FROM unnest(%(ids)b::bigint[], %(tokens)b::bigint[]) AS d(work_id, token)
 WHERE w.work_id = d.work_id AND w.lease_token = d.token AND w.unstarted_attempts < w.attempts
   AND (w.state = '{RUNNING}' OR (w.state IN ('{RETRY}', '{DEAD}') AND w.failure_class = 'lease_expired'))
RETURNING w.work_id
"""

_LOCK_WORK_ITEM_FENCE = f"""
SELECT 1 FROM connector_work_items
 WHERE work_id = %(id)s AND lease_token = %(token)s AND state = '{RUNNING}' AND lease_until > now()
   FOR NO KEY UPDATE
"""
# On the Event path the fence is the execution's start token, which must still be the
# scheduler lease's current token.
_LOCK_EVENT_FENCE = f"""
SELECT 1 FROM event_executions x
  JOIN leases l ON l.lease_name = %(lease)s
 WHERE x.work_id = %(id)s AND x.start_token = %(token)s AND x.state = '{STARTED}'
   AND l.fencing_token = %(token)s AND l.expires_at > clock_timestamp()
   FOR NO KEY UPDATE OF x
"""


def scheduler_lease_name(registration_id: str, revision: int) -> str:
    """The generation-wide scheduler lease of the Event path (the ConnectorSchedulerLease)."""
    return f"workqueue-scheduler:{registration_id}@{revision}"


def lock_fence(conn: Connection, item: ClaimedItem) -> bool:
    """Lock the item's row if the caller still holds it (token current, lease unexpired).

    A handler calls this first in the transaction that writes its effects: once it
    returns True no reclaim, takeover or other claim can take the item until that
    transaction ends, so a stale holder never writes; False means the lease is lost
    (write nothing). Works on both claim paths.
    """
    params = {"id": item.work_id, "token": item.token}
    if item.claim_path == EVENT_PATH:
        params["lease"] = scheduler_lease_name(item.registration_id, item.revision)
        sql = _LOCK_EVENT_FENCE
    else:
        sql = _LOCK_WORK_ITEM_FENCE
    return conn.execute(sql, params).fetchone() is not None


_LOCK_WORK_ITEM_FENCES = f"""
SELECT w.work_id, w.lease_token
  FROM connector_work_items w
  JOIN unnest(%(ids)b::bigint[], %(tokens)b::bigint[]) AS d(work_id, token)
    ON w.work_id = d.work_id AND w.lease_token = d.token
 WHERE w.state = '{RUNNING}' AND w.lease_until > now()
 ORDER BY w.work_id
   FOR NO KEY UPDATE OF w
"""


def lock_fences(conn: Connection, items: Sequence[ClaimedItem]) -> set[tuple[int, int]]:
    """`lock_fence` for a batch: the fences still held, each row locked until the transaction
    ends (WorkItem-path items in one statement, in work_id order); a fence not returned is lost."""
    work_items = [i for i in items if i.claim_path != EVENT_PATH]
    held = {i.fence for i in items if i.claim_path == EVENT_PATH and lock_fence(conn, i)}
    if work_items:
        ids, tokens = _fence_arrays(i.fence for i in work_items)
        held.update(conn.execute(_LOCK_WORK_ITEM_FENCES, {"ids": ids, "tokens": tokens}, prepare=True).fetchall())
    return held


def renew(conn: Connection, fences: Iterable[tuple[int, int]], lease_ttl: timedelta) -> set[int]:
    """Extend the leases still held; returns the work_ids renewed.

    Fences not returned are lost, or locked by someone else for a moment (then still
    held and renewed next time): `held` tells which.
    """
    ids, tokens = _fence_arrays(fences)
    if not ids:
        return set()
    rows = conn.execute(_RENEW, {"ids": ids, "tokens": tokens, "ttl": lease_ttl}, prepare=True).fetchall()
    return {r[0] for r in rows}


def held(conn: Connection, fences: Iterable[tuple[int, int]]) -> dict[int, str]:
    """work_id -> state of each fence's row while it still carries the fence's token.

    'running' (with an unexpired lease) means still held; a final state with the token
    shows what became of it (a finalizing statement whose answer was lost in a reconnect).
    """
    ids, tokens = _fence_arrays(fences)
    if not ids:
        return {}
    rows = conn.execute(
        f"""SELECT w.work_id, CASE WHEN w.state = '{RUNNING}' AND w.lease_until <= now() THEN 'expired'
                                   ELSE w.state END
              FROM connector_work_items w
              JOIN unnest(%(ids)b::bigint[], %(tokens)b::bigint[]) AS d(work_id, token)
                ON w.work_id = d.work_id AND w.lease_token = d.token""",
        {"ids": ids, "tokens": tokens},
    ).fetchall()
    return dict(rows)


def complete(conn: Connection, fences: Iterable[tuple[int, int]], *, outcome: str = "succeeded") -> set[int]:
    """Complete every item still held with its token; returns the work_ids completed."""
    ids, tokens = _fence_arrays(fences)
    if not ids:
        return set()
    rows = conn.execute(_COMPLETE, {"ids": ids, "tokens": tokens, "outcome": outcome}, prepare=True).fetchall()
    return {r[0] for r in rows}


def _failure_params(failures: Sequence[Failure]) -> dict[str, list]:
    ordered = sorted(failures, key=lambda f: f.work_id)
    return {
        "ids": [f.work_id for f in ordered],
        "tokens": [f.token for f in ordered],
        "classes": [sanitize_summary(f.failure_class, 100) or "error" for f in ordered],
        "summaries": [sanitize_summary(f.summary) for f in ordered],
        "delays": [max(float(f.delay_s), 0.0) for f in ordered],
        "terminal": [bool(f.terminal) for f in ordered],
        "uncounted": [bool(f.uncounted) for f in ordered],
    }


def finalize_failures(conn: Connection, failures: Sequence[Failure]) -> dict[int, str]:
    """Record failed attempts (retry with backoff, or dead); returns work_id -> new state.

    Items missing from the result were no longer held with the given token.
    """
    if not failures:
        return {}
    rows = conn.execute(_FAIL, _failure_params(failures), prepare=True).fetchall()
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
    """Take back expired leases (each counts as an attempt): to 'retry' after the policy's
    backoff, or 'dead' when the budget is spent."""
    with conn.transaction():
        expired = conn.execute(_EXPIRED_LEASES, {"limit": limit}).fetchall()
        failures = [
            Failure(
                work_id,
                token,
                "lease_expired",
                f"lease expired before its holder finished (attempt {attempts} of {max_attempts})",
                policy.delay(attempts),
            )
            for work_id, token, attempts, max_attempts in expired
        ]
        rows = conn.execute(_RECLAIM, _failure_params(failures)).fetchall() if failures else []
    dead = sum(1 for r in rows if r[1] == DEAD)
    return ReclaimReport(retried=len(rows) - dead, dead=dead)


def running_of(conn: Connection, owner: str) -> list[tuple[int, int]]:
    """Fences of the items `owner` holds running (the running-rows index scopes the scan)."""
    rows = conn.execute(
        f"SELECT work_id, lease_token FROM connector_work_items WHERE state = '{RUNNING}' AND lease_owner = %s",
        (owner,),
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def release_unstarted(conn: Connection, fences: Iterable[tuple[int, int]]) -> set[int]:
    """Hand back claimed attempts whose handler never started; returns the work_ids recorded."""
    ids, tokens = _fence_arrays(fences)
    if not ids:
        return set()
    return {r[0] for r in conn.execute(_RELEASE_UNSTARTED, {"ids": ids, "tokens": tokens}).fetchall()}
