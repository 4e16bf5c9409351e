"""The writeback ledger in the Postgres control plane (docs/design/writeback-run.md, "Ledger tables and states").

Runs, current record state and append-only attempt evidence. Every API batch is
persisted in one statement (attempts appended, new records inserted and known ones
updated, set-based, never one statement per record), and that
transaction also renews the job lease under its fencing token: when the token is
stale the attempt evidence is still kept, record state is left to the lease's
current holder, and LeaseLost is raised so the run stops before its next batch.

Each execution of a run has its own identity (`execution_id`) and its own run row (the
run id groups them): the job lease is owned by `<run_id>@<execution_id>`, so a second
execution with the same run id is refused while the first one's lease is live. An
execution that finds the lease expired, or held by an execution whose control-plane
session is gone, takes it over and marks the older executions still `running` as
`abandoned`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from psycopg import Connection

from nexus_pipelines.control import leases
from nexus_pipelines.control.leases import Lease, LeaseLost

LEASE_PREFIX = "writeback:"
ATTEMPT_RETENTION = timedelta(days=90)
RECORD_STATUSES = ("succeeded", "retryable_failed", "permanent_failed")


def lease_name(job_name: str) -> str:
    return f"{LEASE_PREFIX}{job_name}"


def lease_owner(run_id: str, execution_id: str) -> str:
    return f"{run_id}@{execution_id}"


@dataclass(frozen=True)
class LeaseHolder:
    run_id: str
    execution_id: str | None
    expires_at: datetime
    token: int
    alive: bool  # False: the control-plane session of the holder's execution is gone

    def describe(self) -> str:
        return (f"run {self.run_id} (execution {self.execution_id or 'unknown'}) holds it until "
                f"{self.expires_at:%Y-%m-%d %H:%M:%S} UTC")


@dataclass(frozen=True)
class LeaseClaim:
    """What asking for the job lease found: the lease, or the live holder that keeps it;
    and the executions this one found dead and marked abandoned (with why)."""

    lease: Lease | None
    holder: LeaseHolder | None = None
    abandoned: tuple[str, ...] = ()  # "run R execution E"
    reason: str | None = None  # why those executions were abandoned


@dataclass(frozen=True)
class RecordState:
    external_id: str
    payload_hash: str
    status: str
    attempt_count: int
    next_retry_at: datetime | None
    crm_record_id: str | None
    error_code: str | None


@dataclass(frozen=True)
class AttemptOutcome:
    """One record's result in one API batch, ready to persist."""

    external_id: str
    payload_hash: str
    source_version: str | None
    attempt_number: int  # attempts for this payload hash, this one included
    status: str  # one of RECORD_STATUSES
    crm_record_id: str | None
    http_status: int | None
    error_code: str | None
    error_message: str | None
    duration_ms: int | None
    retry_delay_s: float | None  # retryable only: next_retry_at = now + this


@dataclass(frozen=True)
class BatchCounts:
    succeeded: int = 0
    retryable_failed: int = 0
    permanently_failed: int = 0
    crm_calls: int = 0


# Every execution inserts its own run row; the run id groups a run's executions. The
# row names the execution's control-plane session, so a later execution can tell whether
# a holder of the job lease is still alive.
_START_RUN = """
INSERT INTO outbound_runs (job_name, run_id, execution_id, status, started_at, dry_run, options, lease_token,
                           session_pid, session_started_at, selected_rows, unchanged_rows, succeeded_rows,
                           retryable_failed_rows, permanently_failed_rows)
VALUES (%(job)s, %(run)s, %(execution)s, 'running', clock_timestamp(), %(dry)s, %(options)s, %(token)s,
        pg_backend_pid(), (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()), 0, 0, 0, 0, 0)
"""

# The live job lease's holder, and whether the session its run row names still exists
# (NULL while the holder has not written its run row yet: then it counts as alive). A
# session of another database role shows no backend_start: it counts as alive too.
_LEASE_HOLDER = """
SELECT v.owner_run_id, v.owner_execution_id, v.expires_at, v.fencing_token,
       (SELECT r.session_pid IS NULL OR EXISTS (
                   SELECT 1 FROM pg_stat_activity a
                    WHERE a.pid = r.session_pid
                      AND (a.backend_start = r.session_started_at OR a.backend_start IS NULL))
          FROM outbound_runs r
         WHERE r.job_name = v.job_name AND r.lease_token = v.fencing_token AND NOT r.dry_run
         LIMIT 1) AS alive
  FROM outbound_job_leases v
 WHERE v.job_name = %s AND v.expires_at > clock_timestamp()
"""

# Once an execution holds the job lease, every older execution still marked running has
# lost it: it stopped without finishing its row. Rows it sent but never recorded keep
# their previous ledger state, so the next run sends them again.
_ABANDON = """
UPDATE outbound_runs r
   SET status = 'abandoned', ended_at = clock_timestamp(),
       error_message = 'abandoned: ' || %(reason)s || '; execution ' || %(execution)s || ' of run ' || %(run)s
                       || ' took over the job lease, and the rows this execution did not record stay retryable'
 WHERE job_name = %(job)s AND status = 'running' AND NOT dry_run AND lease_token < %(token)s
RETURNING run_id, execution_id
"""

_SKIPPED_RUN = """
INSERT INTO outbound_runs (job_name, run_id, execution_id, status, started_at, ended_at, dry_run, options,
                           error_message)
VALUES (%(job)s, %(run)s, %(execution)s, 'skipped_already_running', clock_timestamp(), clock_timestamp(), %(dry)s,
        %(options)s, %(message)s)
"""

# The keys go in binary: the text form of a page of 5,000 cost the mapping thread about
# 3 us a row.
_READ_STATES = """
SELECT external_id, payload_hash, status, attempt_count, next_retry_at, crm_record_id, error_code
  FROM outbound_records
 WHERE job_name = %s AND target_object = %s AND external_id = ANY(%b)
"""

# One statement per API batch (one round trip, atomic): renew the lease under its
# fencing token, append the attempts as one batch row (its arrays are the batch's own
# parameters; the view outbound_record_attempts shows a row per attempt), and - only
# while the token is current - write the record states and bump the run counters. The batch has one time: a time per row widened
# the BRIN range of attempted_at on every insert, one more WAL record per row for the
# commit to flush. Record states are split by one lookup of the batch's keys in the
# primary key: a record new to the ledger is a plain insert, where INSERT ... ON CONFLICT
# wrote a speculative insert and then its confirmation; a known record goes through ON
# CONFLICT, which finds it in its pre-check and updates it without inserting. Nothing
# else writes a job's records while its lease is held, so no other transaction inserts
# one of these keys meanwhile. (MERGE, or an UPDATE joined on the unnested rows, plans a
# hash join over all of the job's records or a nested loop over the batch.) The arrays
# go in binary: their text form was most of the commit's client CPU.
_COMMIT_BATCH = """
WITH lease AS (
    UPDATE leases SET heartbeat_at = clock_timestamp(), expires_at = clock_timestamp() + %(ttl)s
     WHERE %(fenced)s AND lease_name = %(lease_name)s AND fencing_token = %(token)s
       AND expires_at > clock_timestamp()
    RETURNING expires_at
), fence AS (
    SELECT (NOT %(fenced)s) OR EXISTS (SELECT 1 FROM lease) AS ok
), batch AS (
    SELECT clock_timestamp() AS at
), u AS (
    SELECT * FROM unnest(%(ids)b::text[], %(hashes)b::text[], %(versions)b::text[], %(numbers)b::bigint[],
                         %(statuses)b::text[], %(crm_ids)b::text[], %(codes)b::text[], %(messages)b::text[],
                         %(retry)b::float8[])
        AS u(external_id, payload_hash, source_version, attempt_number, status, crm_record_id, error_code,
             error_message, retry_s)
), attempts AS (
    INSERT INTO outbound_attempt_batches (attempted_at, job_name, run_id, batch_id, external_ids, payload_hashes,
        attempt_numbers, statuses, crm_record_ids, http_statuses, error_codes, error_messages, duration_ms)
    SELECT (SELECT at FROM batch), %(job)s, %(run)s, %(batch)s, %(ids)b::text[], %(hashes)b::text[],
           %(numbers)b::bigint[], %(statuses)b::text[], %(crm_ids)b::text[], %(http)b::bigint[], %(codes)b::text[],
           %(messages)b::text[], %(durations)b::bigint[]
     WHERE cardinality(%(ids)b::text[]) > 0
    RETURNING cardinality(external_ids) AS n
), known AS (
    SELECT r.external_id FROM outbound_records AS r
     WHERE r.job_name = %(job)s AND r.target_object = %(object)s AND r.external_id = ANY(%(ids)b::text[])
), state AS (
    SELECT %(job)s AS job_name, %(object)s AS target_object, u.external_id, u.payload_hash, u.source_version,
           u.crm_record_id, u.status, u.attempt_number AS attempt_count, %(run)s AS last_attempt_run_id,
           CASE WHEN u.status = 'succeeded' THEN %(run)s END AS last_success_run_id,
           CASE WHEN u.status = 'retryable_failed'
                THEN (SELECT at FROM batch) + make_interval(secs => u.retry_s) END AS next_retry_at,
           u.error_code, u.error_message, (SELECT at FROM batch) AS updated_at,
           u.external_id IN (SELECT external_id FROM known) AS known
      FROM u WHERE (SELECT ok FROM fence)
), inserted AS (
    INSERT INTO outbound_records (job_name, target_object, external_id, payload_hash, source_version,
        crm_record_id, status, attempt_count, last_attempt_run_id, last_success_run_id, next_retry_at, error_code,
        error_message, updated_at)
    SELECT job_name, target_object, external_id, payload_hash, source_version, crm_record_id, status,
           attempt_count, last_attempt_run_id, last_success_run_id, next_retry_at, error_code, error_message,
           updated_at
      FROM state WHERE NOT known
    RETURNING 1
), updated AS (
    INSERT INTO outbound_records AS r (job_name, target_object, external_id, payload_hash, source_version,
        crm_record_id, status, attempt_count, last_attempt_run_id, last_success_run_id, next_retry_at, error_code,
        error_message, updated_at)
    SELECT job_name, target_object, external_id, payload_hash, source_version, crm_record_id, status,
           attempt_count, last_attempt_run_id, last_success_run_id, next_retry_at, error_code, error_message,
           updated_at
      FROM state WHERE known
    ON CONFLICT (job_name, target_object, external_id) DO UPDATE
       SET payload_hash = EXCLUDED.payload_hash,
           source_version = EXCLUDED.source_version,
           crm_record_id = COALESCE(EXCLUDED.crm_record_id, r.crm_record_id),
           status = EXCLUDED.status,
           attempt_count = EXCLUDED.attempt_count,
           last_attempt_run_id = EXCLUDED.last_attempt_run_id,
           last_success_run_id = COALESCE(EXCLUDED.last_success_run_id, r.last_success_run_id),
           next_retry_at = EXCLUDED.next_retry_at,
           error_code = EXCLUDED.error_code,
           error_message = EXCLUDED.error_message,
           updated_at = EXCLUDED.updated_at
    RETURNING 1
), run AS (
    UPDATE outbound_runs
       SET succeeded_rows = succeeded_rows + %(ok)s,
           retryable_failed_rows = retryable_failed_rows + %(retry_n)s,
           permanently_failed_rows = permanently_failed_rows + %(perm)s,
           batches = batches + 1,
           crm_calls = crm_calls + %(calls)s,
           crm_api_usage = COALESCE(%(usage)s, crm_api_usage)
     WHERE job_name = %(job)s AND run_id = %(run)s AND execution_id = %(execution)s AND (SELECT ok FROM fence)
    RETURNING 1
)
SELECT (SELECT ok FROM fence), (SELECT expires_at FROM lease),
       (SELECT coalesce(sum(n), 0) FROM attempts), (SELECT count(*) FROM inserted) + (SELECT count(*) FROM updated),
       (SELECT count(*) FROM run),
       -- last, once every write above is done: the statement's own time on the database clock
       extract(epoch FROM clock_timestamp() - statement_timestamp())
"""

_FINISH_RUN = """
UPDATE outbound_runs
   SET status = %(status)s, ended_at = clock_timestamp(), error_message = %(message)s,
       selected_rows = %(selected)s, unchanged_rows = %(unchanged)s, succeeded_rows = %(succeeded)s,
       retryable_failed_rows = %(retryable)s, permanently_failed_rows = %(permanent)s,
       batches = %(batches)s, crm_calls = %(calls)s, crm_api_usage = COALESCE(%(usage)s, crm_api_usage)
 WHERE job_name = %(job)s AND run_id = %(run)s AND execution_id = %(execution)s AND status = 'running'
"""


@dataclass(frozen=True)
class BatchCommitted:
    """What a batch commit returns: the renewed lease (None for an unfenced batch) and the
    statement's own time on the database clock, from its start to its last write (the
    flush of its commit and the trips to and from the server not included), so a slow
    commit can be told apart from a slow host."""

    lease: Lease | None
    db_seconds: float


class Ledger:
    """Ledger access for one job and target object over one autocommit connection; run
    writes belong to `execution_id` (one execution of a run)."""

    def __init__(self, conn: Connection, job_name: str, target_object: str, execution_id: str | None = None) -> None:
        self.conn = conn
        self.job_name = job_name
        self.target_object = target_object
        self.execution_id = execution_id or uuid.uuid4().hex[:12]

    # -- lease ------------------------------------------------------------------------

    def acquire_lease(self, run_id: str, ttl: timedelta) -> Lease | None:
        return leases.acquire(self.conn, lease_name(self.job_name), lease_owner(run_id, self.execution_id), ttl)

    def claim_lease(self, run_id: str, ttl: timedelta) -> LeaseClaim:
        """Take the job lease from nobody, from an expired holder, or from a live-leased
        holder whose session is gone; the executions that held it are marked abandoned.
        A live holder keeps it (returned as `holder`)."""
        name, owner = lease_name(self.job_name), lease_owner(run_id, self.execution_id)
        for _ in range(3):  # the holder may release or lose the lease between the reads
            previous = self.conn.execute("SELECT expires_at FROM leases WHERE lease_name = %s", (name,)).fetchone()
            lease = leases.acquire(self.conn, name, owner, ttl)
            if lease is not None:
                reason = f"its lease ran out at {previous[0]:%Y-%m-%d %H:%M:%S} UTC" if previous else "it lost the lease"
                return self._abandon_older(run_id, lease, reason)
            holder = self.lease_holder()
            if holder is None:
                continue
            if holder.alive:
                return LeaseClaim(None, holder)
            lease = leases.take_over(self.conn, name, owner, ttl, holder.token)
            if lease is not None:
                return self._abandon_older(run_id, lease, "its control-plane session ended while it held the lease "
                                                          f"(until {holder.expires_at:%Y-%m-%d %H:%M:%S} UTC)")
        return LeaseClaim(None, self.lease_holder())

    def _abandon_older(self, run_id: str, lease: Lease, reason: str) -> LeaseClaim:
        rows = self.conn.execute(_ABANDON, {"reason": reason, "execution": self.execution_id, "run": run_id,
                                            "job": self.job_name, "token": lease.token}).fetchall()
        return LeaseClaim(lease, abandoned=tuple(f"run {r} execution {e}" for r, e in rows),
                          reason=reason if rows else None)

    def lease_holder(self) -> LeaseHolder | None:
        """Who holds the live job lease, if anyone, and whether its session is alive."""
        row = self.conn.execute(_LEASE_HOLDER, (self.job_name,)).fetchone()
        return None if row is None else LeaseHolder(*row[:4], alive=row[4] is not False)

    def renew_lease(self, lease: Lease, ttl: timedelta) -> Lease:
        return leases.renew(self.conn, lease, ttl)

    def release_lease(self, lease: Lease) -> bool:
        return leases.release(self.conn, lease)

    # -- runs -------------------------------------------------------------------------

    def start_run(self, run_id: str, *, dry_run: bool, options: dict, lease_token: int | None) -> None:
        """Insert this execution's run row (`running`)."""
        self.conn.execute(
            _START_RUN,
            {"job": self.job_name, "run": run_id, "execution": self.execution_id, "dry": dry_run,
             "options": json.dumps(options, sort_keys=True), "token": lease_token},
        )

    def record_skipped(self, run_id: str, *, dry_run: bool, options: dict, message: str) -> None:
        self.conn.execute(
            _SKIPPED_RUN,
            {"job": self.job_name, "run": run_id, "execution": self.execution_id, "dry": dry_run,
             "options": json.dumps(options, sort_keys=True), "message": message},
        )

    def set_source(self, run_id: str, source_run_id: str | None, cutoff: datetime | None) -> None:
        self.conn.execute(
            "UPDATE outbound_runs SET source_run_id = %s, source_cutoff_at = %s "
            "WHERE job_name = %s AND run_id = %s AND execution_id = %s",
            (source_run_id, cutoff, self.job_name, run_id, self.execution_id),
        )

    def set_selection(self, run_id: str, selected: int, unchanged: int) -> None:
        self.conn.execute(
            "UPDATE outbound_runs SET selected_rows = %s, unchanged_rows = %s "
            "WHERE job_name = %s AND run_id = %s AND execution_id = %s",
            (selected, unchanged, self.job_name, run_id, self.execution_id),
        )

    def finish_run(self, run_id: str, status: str, *, selected: int, unchanged: int,
                   succeeded: int, retryable: int, permanent: int, batches: int, crm_calls: int,
                   error_message: str | None, api_usage: str | None = None) -> None:
        self.conn.execute(
            _FINISH_RUN,
            {"status": status, "message": error_message, "selected": selected, "unchanged": unchanged,
             "succeeded": succeeded, "retryable": retryable, "permanent": permanent, "batches": batches,
             "calls": crm_calls, "usage": api_usage, "job": self.job_name, "run": run_id,
             "execution": self.execution_id},
        )

    def run_row(self, run_id: str, execution_id: str | None = None) -> dict | None:
        """The row of one execution of a run: the given one, else the latest."""
        rows = self.executions(run_id)
        if execution_id is not None:
            rows = [r for r in rows if r["execution_id"] == execution_id]
        return rows[-1] if rows else None

    def executions(self, run_id: str) -> list[dict]:
        """Every execution's row of a run, oldest first."""
        cur = self.conn.execute(
            "SELECT * FROM outbound_runs WHERE job_name = %s AND run_id = %s ORDER BY started_at, execution_id",
            (self.job_name, run_id),
        )
        names = [c.name for c in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    # -- records ----------------------------------------------------------------------

    def read_states(self, external_ids: Sequence[str]) -> dict[str, RecordState]:
        """Current states of these records, in one query (callers pass one page of keys)."""
        if not external_ids:
            return {}
        rows = self.conn.execute(_READ_STATES, (self.job_name, self.target_object, list(external_ids))).fetchall()
        return {r[0]: RecordState(*r) for r in rows}

    def commit_batch(self, run_id: str, batch_id: str, lease: Lease | None, lease_ttl: timedelta,
                     outcomes: Sequence[AttemptOutcome], counts: BatchCounts,
                     api_usage: str | None = None) -> BatchCommitted:
        """Persist one API batch atomically, in one statement; returns the renewed lease and the
        statement's time. Raises LeaseLost (with the attempt evidence committed) when the
        fencing token is stale."""
        o = outcomes
        params = {
            "job": self.job_name, "object": self.target_object, "run": run_id, "batch": batch_id,
            "execution": self.execution_id, "usage": api_usage,
            "fenced": lease is not None, "lease_name": lease.name if lease else None,
            "token": lease.token if lease else None, "ttl": lease_ttl,
            "ids": [x.external_id for x in o], "hashes": [x.payload_hash for x in o],
            "versions": [x.source_version for x in o], "numbers": [x.attempt_number for x in o],
            "statuses": [x.status for x in o], "crm_ids": [x.crm_record_id for x in o],
            "http": [x.http_status for x in o], "codes": [x.error_code for x in o],
            "messages": [x.error_message for x in o], "durations": [x.duration_ms for x in o],
            "retry": [x.retry_delay_s for x in o],
            "ok": counts.succeeded, "retry_n": counts.retryable_failed, "perm": counts.permanently_failed,
            "calls": counts.crm_calls,
        }
        fenced_ok, expires_at, _, _, _, db_seconds = self.conn.execute(_COMMIT_BATCH, params, prepare=True).fetchone()
        if lease is None:
            return BatchCommitted(None, float(db_seconds))
        if not fenced_ok:
            raise LeaseLost(
                f"writeback lease {lease.name!r} was lost (token {lease.token}); batch {batch_id} evidence kept, "
                "record state left to the current holder"
            )
        return BatchCommitted(Lease(lease.name, lease.owner_id, lease.token, lease.acquired_at, expires_at),
                              float(db_seconds))

    def record_rows(self, external_ids: Iterable[str] | None = None) -> list[dict]:
        query = "SELECT * FROM outbound_records WHERE job_name = %s AND target_object = %s"
        params: list = [self.job_name, self.target_object]
        if external_ids is not None:
            query += " AND external_id = ANY(%s)"
            params.append(list(external_ids))
        cur = self.conn.execute(query + " ORDER BY external_id", params)
        names = [c.name for c in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def prune_attempts(conn: Connection, *, retention: timedelta = ATTEMPT_RETENTION, chunk: int = 50,
                   max_chunks: int = 1_000) -> int:
    """Delete attempt evidence older than the retention, `chunk` batches at a time;
    returns the number of attempts deleted."""
    total = 0
    for _ in range(max_chunks):
        counts = conn.execute(
            """DELETE FROM outbound_attempt_batches WHERE ctid IN (
                   SELECT ctid FROM outbound_attempt_batches
                    WHERE attempted_at < clock_timestamp() - %s LIMIT %s)
               RETURNING cardinality(external_ids)""",
            (retention, chunk),
        ).fetchall()
        total += sum(n for n, in counts)
        if len(counts) < chunk:
            break
    return total
