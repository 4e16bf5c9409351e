"""The Event path: one ordered consumer per generation (the retained
ConnectorSchedulerLease compatibility surface), as a real second way to run work
(docs/design/work-queue.md, "Generations and activation").

When to use which: the WorkItem path (`worker.drain`) is the default: any number of
drains on any number of machines claim rows by compare-and-swap, with source and
target lanes. The Event path suits a small deployment that wants exactly one consumer
per generation and strict delivery order without row claims, and it is where a
rollback (`rollback.py`) hands fenced work; a generation is owned by one path at a
time, which the database enforces.

The holder of the generation-wide scheduler lease (`leases`, name from
`claims.scheduler_lease_name`) executes the generation's work in delivery order
(event id, then work type; an execution waits behind an unfinished one of the same
source lane), starting only the work types its registry handles. Execution state lives in `event_executions`, never on the immutable
event. Each attempt is recorded as started, under the lease token, before its handler
runs (the Event path's dispatch record); the handler is the one of the code
location's registry, receiving a `ClaimedItem` whose `claim_path` is 'event' (so
`claims.lock_fence` fences its writes with the lease). A terminal outcome (succeeded,
failed, or unknown when an interrupted attempt spent the budget) is written together
with its LegacyOutcomeReceipt; a new lease holder first settles the attempts its
predecessor left started. Failures of an Event-owned generation are read from here
(`dlq.list_dead`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable

from psycopg import Connection
from psycopg_pool import ConnectionPool

from nexus_pipelines.control import leases
from nexus_pipelines.workqueue import legacy_outcomes
from nexus_pipelines.workqueue.claims import ClaimedItem, scheduler_lease_name
from nexus_pipelines.workqueue.execution import (
    DrainReport,
    Heartbeat,
    HandlerResult,
    StopRule,
    default_worker_id,
    failure_for,
    run_handler,
)
from nexus_pipelines.workqueue.handlers import HandlerRegistry
from nexus_pipelines.workqueue.retry import DEFAULT_POLICY, RetryPolicy, sanitize_summary
from nexus_pipelines.workqueue.session import ControlSession
from nexus_pipelines.workqueue.states import (
    ACTIVE,
    EVENT_PATH,
    EXECUTABLE,
    EXECUTION_UNFINISHED,
    FAILED,
    RETRY,
    STARTED,
    SUCCEEDED,
    UNKNOWN,
    sql_in,
)

_START_NEXT = f"""
WITH gen AS MATERIALIZED (
    SELECT 1 FROM workqueue_generations
     WHERE registration_id = %(reg)s AND revision = %(rev)s AND claim_path = '{EVENT_PATH}' AND status = '{ACTIVE}'
       FOR KEY SHARE
),
lease AS MATERIALIZED (
    SELECT expires_at FROM leases
     WHERE lease_name = %(lease)s AND fencing_token = %(token)s AND expires_at > clock_timestamp()
),
next AS (
    SELECT x.work_id
      FROM event_executions x
     WHERE x.registration_id = %(reg)s AND x.revision = %(rev)s
       AND x.state IN {sql_in(EXECUTABLE)} AND x.run_after <= now()
       AND x.work_type = ANY(%(types)s::text[])
       AND EXISTS (SELECT 1 FROM gen) AND EXISTS (SELECT 1 FROM lease)
       AND (x.source_lane_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM event_executions h
             WHERE h.registration_id = x.registration_id AND h.revision = x.revision
               AND h.source_lane_key = x.source_lane_key AND h.event_id < x.event_id
               AND h.state IN {sql_in(EXECUTION_UNFINISHED)}))
     ORDER BY x.event_id, x.work_type
     LIMIT 1
       FOR UPDATE OF x SKIP LOCKED
)
UPDATE event_executions x
   SET state = '{STARTED}', start_token = %(token)s, attempts = x.attempts + 1, started_at = now(), updated_at = now()
  FROM next, connector_outbox_events e
 WHERE x.work_id = next.work_id AND e.event_id = x.event_id
RETURNING x.work_id, x.event_id, x.work_type, x.queue_class, x.attempts, x.max_attempts, x.source_lane_key,
          x.target_lane_key, x.rollback_fence_id, e.payload::text, (SELECT expires_at FROM lease)
"""

# Locks an execution still held by `token` under the current lease (or, for a takeover,
# one left started by an earlier token).
_HELD_EXECUTION = f"""
SELECT x.attempts, x.max_attempts, x.start_token
  FROM event_executions x
  JOIN leases l ON l.lease_name = %(lease)s AND l.fencing_token = %(token)s AND l.expires_at > clock_timestamp()
 WHERE x.work_id = %(id)s AND x.state = '{STARTED}' AND {{token_rule}}
   FOR NO KEY UPDATE OF x
"""
_OWN_EXECUTION = _HELD_EXECUTION.format(token_rule="x.start_token = %(token)s")
_INTERRUPTED_EXECUTION = _HELD_EXECUTION.format(token_rule="x.start_token <> %(token)s")

_SET_OUTCOME = f"""
UPDATE event_executions
   SET state = %(state)s, outcome = %(outcome)s, failure_class = %(failure_class)s, failure_summary = %(summary)s,
       run_after = CASE WHEN %(state)s = '{RETRY}' THEN now() + make_interval(secs => %(delay)s) ELSE run_after END,
       finished_at = CASE WHEN %(state)s = '{RETRY}' THEN NULL ELSE now() END,
       updated_at = now()
 WHERE work_id = %(id)s
"""


class _Outcome:
    """The outcome of one attempt, as the Event path records it."""

    __slots__ = ("state", "outcome", "failure_class", "summary", "delay_s")

    def __init__(self, state: str, outcome: str | None = None, failure_class: str | None = None,
                 summary: str | None = None, delay_s: float = 0.0) -> None:
        self.state, self.outcome, self.failure_class, self.summary, self.delay_s = (
            state, outcome, failure_class, summary, delay_s)

    @property
    def terminal(self) -> bool:
        return self.state != RETRY

    def params(self, work_id: int) -> dict:
        return {"id": work_id, "state": self.state, "outcome": self.outcome, "failure_class": self.failure_class,
                "summary": sanitize_summary(self.summary) if self.summary else None, "delay": self.delay_s}

    def detail(self) -> dict:
        return {k: v for k, v in (("outcome", self.outcome), ("failure_class", self.failure_class)) if v}


def _outcome_of(result: HandlerResult, policy: RetryPolicy) -> _Outcome:
    if result.error is None:
        return _Outcome(SUCCEEDED, outcome=result.outcome or "succeeded")
    failure = failure_for(result.item, result.error, policy)
    spent = failure.terminal or result.item.attempts >= result.item.max_attempts
    return _Outcome(FAILED if spent else RETRY, failure_class=failure.failure_class, summary=failure.summary,
                    delay_s=failure.delay_s)


@dataclass
class EventPathReport(DrainReport):
    unknown: int = 0  # attempts interrupted with the budget spent: outcome quarantined
    interrupted: int = 0  # attempts a previous lease holder left started
    reconciled: int = 0  # fenced work items projected from their receipts


class EventExecutor:
    """One run of the Event path for one generation; `run_event_path()` builds and runs it."""

    def __init__(self, source: str | ConnectionPool, registry: HandlerRegistry, registration_id: str,
                 revision: int, **options) -> None:
        self._source = source
        self._registry = registry
        self._reg, self._rev = registration_id, revision
        self._opt = options
        self._policy: RetryPolicy = options["retry_policy"]
        self.report = EventPathReport(worker_id=options["worker_id"] or default_worker_id())
        self._ttl = timedelta(seconds=options["lease_ttl_s"])
        self._stop = StopRule(options["stop_event"], options["time_budget_s"], options["max_items"])
        self._lease_name = scheduler_lease_name(registration_id, revision)
        self._lease: leases.Lease | None = None
        self._lease_lost = threading.Event()
        self._current: ClaimedItem | None = None
        self.session = self._session("executor")

    def _session(self, role: str) -> ControlSession:
        deadline = self._stop.deadline
        return ControlSession(
            self._source, on_outage=self._opt["on_outage"],
            give_up_at=lambda: deadline + self._opt["lease_ttl_s"] if deadline is not None else None,
            name=f"event path {self._reg}@{self._rev} ({role})",
        )

    def run(self) -> EventPathReport:
        try:
            self._lease = self.session.run(lambda c: leases.acquire(c, self._lease_name, self.report.worker_id, self._ttl))
            if self._lease is None:
                self.report.stopped = "lease_held"  # another executor runs this generation
                return self.report
            heartbeat = Heartbeat(self._session("heartbeat"), self._renew, max(self._opt["lease_ttl_s"] / 3, 0.05),
                                  on_error=self._lose_lease)
            heartbeat.start()
            try:
                self._settle_interrupted()
                self.report.stopped = self._loop()
            finally:
                heartbeat.stop()
                heartbeat.join(5)
                self.report.add_session(heartbeat.session)
            self._project()
            self.session.run(lambda c: leases.release(c, self._lease))
        finally:
            self.session.close()
            self.report.add_session(self.session)
            self.report.elapsed_s = time.monotonic() - self._stop.started
        return self.report

    def _renew(self, conn: Connection) -> None:
        self._lease = leases.renew(conn, self._lease, self._ttl)

    def _lose_lease(self) -> None:
        self._lease_lost.set()
        if self._current is not None:
            self._current.lease_lost.set()

    def _loop(self) -> str:
        last_projection = time.monotonic()
        while True:
            if self._lease_lost.is_set():
                return "lease_lost"
            reason = self._stop.reason(self.report.claimed)
            if reason:
                return reason
            if time.monotonic() - last_projection >= self._opt["project_every_s"]:
                self._project()
                last_projection = time.monotonic()
            started = self.session.run(self._start_next)
            if started is None:
                if not self.session.run(self._admitted):
                    return "not_admitted"  # quiesced, or no longer Event-owned
                if self._opt["idle_exit"]:
                    return "idle"
                self._stop.idle_wait(self._opt["poll_interval_s"])
                continue
            item, fence = started
            self.report.claimed += 1
            self._current = item
            result = run_handler(self._registry, item)
            self._current = None
            if not result.started:
                self.report.lost += 1  # the lease went first: the next holder settles the attempt
                continue
            self._finish(item, fence, _outcome_of(result, self._policy))

    def _start_next(self, conn: Connection) -> tuple[ClaimedItem, int | None] | None:
        row = conn.execute(_START_NEXT, {"reg": self._reg, "rev": self._rev, "lease": self._lease_name,
                                         "token": self._lease.token, "types": self._registry.work_types}).fetchone()
        if row is None:
            return None
        (work_id, event_id, work_type, queue_class, attempts, max_attempts, source_lane, target_lane, fence,
         payload, lease_until) = row
        item = ClaimedItem(
            work_id=work_id, token=self._lease.token, event_id=event_id, registration_id=self._reg,
            revision=self._rev, work_type=work_type, queue_class=queue_class, attempts=attempts,
            max_attempts=max_attempts, lease_owner=self.report.worker_id, lease_until=lease_until,
            source_lane_key=source_lane, target_lane_key=target_lane, payload_json=payload, claim_path=EVENT_PATH,
        )
        return item, fence

    def _admitted(self, conn: Connection) -> bool:
        row = conn.execute(
            "SELECT claim_path, status FROM workqueue_generations WHERE registration_id = %s AND revision = %s",
            (self._reg, self._rev),
        ).fetchone()
        return row == (EVENT_PATH, ACTIVE)

    def _finish(self, item: ClaimedItem, fence: int | None, outcome: _Outcome) -> None:
        execution = legacy_outcomes.Execution(item.work_id, item.event_id, item.work_type, self._reg, self._rev, fence)
        recorded = self.session.run(lambda conn: self._record(conn, execution, item.token, outcome, _OWN_EXECUTION))
        if not recorded:
            self.report.lost += 1  # the lease was lost: the next holder settles the attempt
        elif outcome.state == SUCCEEDED:
            self.report.completed += 1
        elif outcome.state == FAILED:
            self.report.dead += 1
        else:
            self.report.retried += 1

    def _record(self, conn: Connection, execution: legacy_outcomes.Execution, start_token: int, outcome: _Outcome,
                held_sql: str) -> bool:
        """Write one attempt's outcome (and a terminal one's receipt) if the lease still allows it."""
        with conn.transaction():
            held = conn.execute(held_sql, {"lease": self._lease_name, "token": self._lease.token,
                                           "id": execution.work_id}).fetchone()
            if held is None:
                return False  # lease lost, or the outcome was recorded already: nothing changes
            conn.execute(_SET_OUTCOME, outcome.params(execution.work_id))
            if outcome.terminal:
                legacy_outcomes.record(conn, execution, outcome.state, token=start_token, detail=outcome.detail(),
                                       recorded_by=self.report.worker_id)
        return True

    def _settle_interrupted(self) -> None:
        """Attempts an earlier lease holder left started: retried, or 'unknown' once spent
        (the attempt may or may not have taken effect)."""
        rows = self.session.run(lambda conn: conn.execute(
            f"""SELECT work_id, event_id, work_type, attempts, max_attempts, start_token, rollback_fence_id
                  FROM event_executions
                 WHERE registration_id = %s AND revision = %s AND state = '{STARTED}' AND start_token <> %s""",
            (self._reg, self._rev, self._lease.token)).fetchall())
        for work_id, event_id, work_type, attempts, max_attempts, start_token, fence in rows:
            spent = attempts >= max_attempts
            outcome = _Outcome(UNKNOWN if spent else RETRY, failure_class="interrupted",
                               summary=f"attempt {attempts} of {max_attempts} was interrupted with its lease holder",
                               delay_s=self._policy.delay(attempts))
            execution = legacy_outcomes.Execution(work_id, event_id, work_type, self._reg, self._rev, fence)
            if self.session.run(lambda conn: self._record(conn, execution, start_token, outcome,
                                                          _INTERRUPTED_EXECUTION)):
                self.report.interrupted += 1
                self.report.unknown += spent

    def _project(self) -> None:
        self.report.reconciled += self.session.run(lambda conn: legacy_outcomes.project(conn, self._reg, self._rev))


def run_event_path(
    dsn_or_pool: str | ConnectionPool,
    registry: HandlerRegistry,
    registration_id: str,
    revision: int,
    *,
    worker_id: str | None = None,
    max_items: int | None = None,
    time_budget_s: float | None = None,
    lease_ttl_s: float = 30.0,
    retry_policy: RetryPolicy = DEFAULT_POLICY,
    idle_exit: bool = True,
    poll_interval_s: float = 0.25,
    project_every_s: float = 2.0,
    stop_event: threading.Event | None = None,
    on_outage: Callable[[str], None] | None = None,
) -> EventPathReport:
    """Execute the generation's due work in delivery order while holding its scheduler lease.

    Returns at once (stopped='lease_held') when another executor holds the lease, and
    stops when the generation no longer admits Event executions ('not_admitted').
    """
    if lease_ttl_s <= 0:
        raise ValueError("lease_ttl_s must be positive")
    return EventExecutor(
        dsn_or_pool, registry, registration_id, revision, worker_id=worker_id,
        max_items=max_items, time_budget_s=time_budget_s, lease_ttl_s=lease_ttl_s, retry_policy=retry_policy,
        idle_exit=idle_exit, poll_interval_s=poll_interval_s, project_every_s=project_every_s,
        stop_event=stop_event, on_outage=on_outage,
    ).run()


# --- what the gates read and do ------------------------------------------------------------


class ConfirmRefused(RuntimeError):
    """There is no unknown outcome to confirm; nothing was written."""


@dataclass(frozen=True)
class EventPathStatus:
    lease_holder: str | None  # the live scheduler lease's owner
    lease_expires_at: datetime | None
    started: int  # executions recorded as started (in flight, or left by a dead holder)
    unfinished: int  # pending, retry or started
    fenced_unfinished: int  # of those, the ones a rollback fence handed over
    unknown: int


def status(conn: Connection, registration_id: str, revision: int) -> EventPathStatus:
    lease = conn.execute(
        "SELECT owner_id, expires_at FROM leases WHERE lease_name = %s AND expires_at > clock_timestamp()",
        (scheduler_lease_name(registration_id, revision),),
    ).fetchone()
    started, unfinished, fenced, unknown = conn.execute(
        f"""SELECT count(*) FILTER (WHERE state = '{STARTED}'),
                   count(*) FILTER (WHERE state IN {sql_in(EXECUTION_UNFINISHED)}),
                   count(*) FILTER (WHERE state IN {sql_in(EXECUTION_UNFINISHED)} AND rollback_fence_id IS NOT NULL),
                   count(*) FILTER (WHERE state = '{UNKNOWN}')
              FROM event_executions WHERE registration_id = %s AND revision = %s""",
        (registration_id, revision),
    ).fetchone()
    return EventPathStatus(lease[0] if lease else None, lease[1] if lease else None, started, unfinished, fenced,
                           unknown)


def confirm(conn: Connection, work_id: int, outcome: str, *, recorded_by: str
            ) -> tuple[legacy_outcomes.LegacyOutcomeReceipt, int]:
    """An operator's confirmation of an 'unknown' outcome: the next receipt version and the
    execution's final state in one transaction, then the generation's projection. Returns
    the receipt and how many fenced items were reconciled."""
    with conn.transaction():
        row = conn.execute(
            f"""SELECT event_id, work_type, registration_id, revision, rollback_fence_id FROM event_executions
                 WHERE work_id = %s AND state = '{UNKNOWN}' FOR NO KEY UPDATE""",
            (work_id,),
        ).fetchone()
        if row is None:
            raise ConfirmRefused(f"work {work_id} has no unknown Event-path outcome to confirm")
        execution = legacy_outcomes.Execution(work_id, *row)
        receipt = legacy_outcomes.record(conn, execution, outcome, token=None, detail={"confirmed_by": recorded_by},
                                         recorded_by=recorded_by)
        conn.execute(
            "UPDATE event_executions SET state = %s, outcome = 'confirmed by operator', updated_at = now() "
            "WHERE work_id = %s",
            (outcome, work_id),
        )
    return receipt, legacy_outcomes.project(conn, execution.registration_id, execution.revision)
