"""The ordered steps of a writeback run (docs/design/writeback-run.md, "Steps"), shared by the Dagster
assets and the CLI.

1. configuration (already loaded and validated by the caller);
2. job lease + `running` run row (dry runs write nothing and take no lease);
3. source readiness and freshness;
4. NexusCRM authentication and object/field preflight;
5. the run-scoped candidate table;
6. set-based key checks, then the no-write validation pass (map and hash every row,
   and count what the write pass will send);
7. current record states, read page by page alongside the rows;
8. batched upserts, each batch's evidence committed while the next batch is in flight;
9. final counts and status;
10. cleanup in `finally`: candidate table deleted, lease released.

`Runner.execute()` is a generator of events (check outcomes, progress lines, stage
timings) ending with a `JobResult`, so the Dagster layer can turn them into asset
check results and log lines as they happen; `Runner.run()` drains it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

import psycopg
from google.api_core import exceptions as gexc
from google.cloud import bigquery
from google.cloud.bigquery_storage_v1 import BigQueryReadClient

from nexus_pipelines.control import leases
from nexus_pipelines.control.leases import Lease, LeaseLost
from nexus_pipelines.heap import heap_before_frozen
from nexus_pipelines.integrations.nexuscrm import (
    ApiLimit,
    BatchWriteOutcome,
    NexusCrmClient,
    NexusCrmCredentials,
    NexusCrmError,
    sanitize_error_message,
)
from nexus_pipelines.redaction import printable
from nexus_pipelines.writeback.batch import Pending, ReadBack, Settlement, may_need_read_back, read_back_ids, settle
from nexus_pipelines.writeback.commits import Committed, Committer
from nexus_pipelines.writeback.config import ConfigError, LoadedConfig, check_target_url
from nexus_pipelines.writeback.contract import JobContext, JobResult
from nexus_pipelines.writeback.hashing import redact_id
from nexus_pipelines.writeback.ledger import LeaseClaim, LeaseHolder, Ledger, RecordState, prune_attempts
from nexus_pipelines.writeback.logs import log_event
from nexus_pipelines.writeback.mapping import Mapper, MappedRecord, MappingError
from nexus_pipelines.writeback.prefetch import Gate, gated, prefetch
from nexus_pipelines.writeback.source import (
    CandidateReader,
    CandidateTable,
    Readiness,
    SourceError,
    WarehouseTimer,
    candidate_table_id,
    check_keys,
    drop_candidates,
    freshness_problem,
    materialize_candidates,
    missing_external_ids,
    run_readiness,
)

logger = logging.getLogger("nexus_pipelines.writeback")

# Check names, as the Dagster layer shows them (asset -> checks).
CHECK_SOURCE_READY = "source_ready"
CHECK_SOURCE_FRESH = "source_fresh"
CHECK_KEYS_NOT_NULL = "external_id_not_null"
CHECK_KEYS_UNIQUE = "external_id_unique"
CHECK_MAPPING = "mapping_and_ownership"
ALL_CHECKS = (CHECK_SOURCE_READY, CHECK_SOURCE_FRESH, CHECK_KEYS_NOT_NULL, CHECK_KEYS_UNIQUE, CHECK_MAPPING)

STAGE_READINESS = "readiness"
STAGE_PREFLIGHT = "crm_preflight"
STAGE_CANDIDATES = "candidate_table"
STAGE_KEYS = "key_checks"
STAGE_VALIDATION = "validation_pass"
STAGE_STATE_READ = "state_read"
STAGE_MAPPING = "mapping_hashing"
STAGE_CRM = "crm_calls"
STAGE_LEDGER = "ledger_writes"  # the batch commits' own time, on the commit thread
STAGE_LEDGER_WAIT = "ledger_wait"  # the time the write pass waited for them
STAGE_LEASE = "lease_checks"  # the lease renewed or its token read after each batch's answer
STAGE_CLEANUP = "cleanup"

PAGE_SIZE = 5000  # validation pass: throughput
WRITE_PAGE_SIZE = 1000  # write pass: one page is read and mapped within one CRM call
REJECTED_SAMPLE = 5  # rejected external IDs a run reports by name


class RunFailed(RuntimeError):
    """A step failed in a way the run reports as `failed` (one clear line)."""


@dataclass(frozen=True)
class CheckOutcome:
    name: str
    passed: bool
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Progress:
    message: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StageDone:
    stage: str
    seconds: float
    metadata: dict[str, Any] = field(default_factory=dict)


Event = CheckOutcome | Progress | StageDone | JobResult
Decision = Literal["write", "unchanged", "deferred"]


def decide(record: MappedRecord, prior: RecordState | None, *, now: datetime, force: bool, retry_failed: bool,
           skip_unchanged: bool) -> Decision:
    """Whether a validated row is sent (docs/design/writeback-run.md, "Skipping unchanged records")."""
    if retry_failed:
        # Operator replay of retryable failures only; their backoff is overridden.
        return "write" if prior is not None and prior.status == "retryable_failed" else "unchanged"
    if force or prior is None or prior.payload_hash != record.payload_hash or not skip_unchanged:
        return "write"
    if prior.status in ("succeeded", "permanent_failed"):
        return "unchanged"
    if prior.next_retry_at is None or prior.next_retry_at <= now:
        return "write"
    return "deferred"


def crm_credentials(config: LoadedConfig) -> NexusCrmCredentials:
    """The CRM credentials from the environment variables the config names (the only
    place secret values are read); raises ConfigError or NexusCrmConfigError, one line."""
    import os

    target = config.config.target
    base_url = os.environ.get(target.base_url_env, "").strip()
    if base_url:
        check_target_url(base_url, local_mode=target.local_mode)
    return NexusCrmCredentials.from_env(
        target.base_url_env, target.client_id_env, target.client_secret_env, allow_http=target.local_mode
    )


def default_crm_factory(config: LoadedConfig) -> NexusCrmClient:
    """Compose the real client from the named environment variables."""
    credentials = crm_credentials(config)
    w = config.config.write
    return NexusCrmClient(credentials, max_attempts=w.max_attempts, base_backoff_s=w.base_backoff_seconds,
                          max_backoff_s=w.max_backoff_seconds)


@dataclass(frozen=True)
class _Sent:
    """A batch the CRM answered, waiting for its commit to be counted and reported."""

    number: int
    batch_id: str
    size: int
    outcome: BatchWriteOutcome
    crm_seconds: float
    settled: Settlement


@dataclass
class _Counts:
    selected: int = 0
    unchanged: int = 0
    deferred: int = 0
    to_write: int = 0
    succeeded: int = 0
    retryable: int = 0
    permanent: int = 0
    new_permanent: int = 0
    blocking: int = 0
    batches: int = 0
    crm_calls: int = 0  # upsert requests
    read_back_calls: int = 0  # queries reading created records' ids back


class Runner:
    """One execution of one registered job."""

    def __init__(
        self,
        job_name: str,
        mapper: Mapper,
        config: LoadedConfig,
        *,
        bq: bigquery.Client,
        conn: psycopg.Connection,
        storage: BigQueryReadClient | None = None,
        crm_factory: Callable[[LoadedConfig], NexusCrmClient] = default_crm_factory,
        page_size: int = PAGE_SIZE,
        write_page_size: int = WRITE_PAGE_SIZE,
        prefetch_pages: int = 2,
        log: logging.Logger | None = None,
    ) -> None:
        self.job_name = job_name
        self.mapper = mapper
        self.loaded = config
        self.config = config.config
        self.bq = bq
        self.storage = storage  # the Storage Read API client the candidates are read with, if any
        self.reader: CandidateReader | None = None
        self.ledger = Ledger(conn, job_name, mapper.TARGET_OBJECT)  # one execution, its own identity
        self.execution_id = self.ledger.execution_id
        self.crm_factory = crm_factory
        self.page_size = page_size
        self.write_page_size = write_page_size
        self._gate: Gate | None = None
        self.prefetch_pages = prefetch_pages
        self.log = log or logger
        self.warehouse = WarehouseTimer()
        self.stage_seconds: dict[str, float] = {}
        self.ledger_commit_ms: list[float] = []  # each batch commit's time on the commit thread
        self.ledger_commit_db_ms: list[float] = []  # and its statement's own time on the database clock
        self.lease: Lease | None = None
        self._last_renew = 0.0
        self.table_id: str | None = None
        self.readiness: Readiness | None = None
        self.api_usage: ApiLimit | None = None  # the CRM's last Sforce-Limit-Info
        self.rejected: list[tuple[str, str]] = []  # the first rejected external IDs, with error codes
        self.took_over: str | None = None  # the executions this one found dead and abandoned

    # -- public -----------------------------------------------------------------------

    def run(self, context: JobContext) -> JobResult:
        result = None
        for event in self.execute(context):
            if isinstance(event, JobResult):
                result = event
        assert result is not None
        return result

    def execute(self, context: JobContext) -> Iterator[Event]:
        with heap_before_frozen():  # no full collection rescans the process's heap during the run
            yield from self._execute(context)

    def _execute(self, context: JobContext) -> Iterator[Event]:
        counts = _Counts()
        options = {"external_ids": len(context.external_ids), "retry_failed": context.retry_failed,
                   "force": context.force, "dry_run": context.dry_run}
        ttl = timedelta(seconds=self.config.write.lease_ttl_seconds)
        self._event("run_started", context, **options)
        if not context.dry_run:
            claim = self.ledger.claim_lease(context.run_id, ttl)
            if claim.lease is None:
                yield from self._lease_held(context, options, claim.holder)
                return
            self.lease = claim.lease
            self._last_renew = time.monotonic()
            if claim.abandoned:
                yield self._took_over(context, claim)
        status: str = "failed"
        error: str | None = None
        crm: NexusCrmClient | None = None
        try:
            self.ledger.start_run(context.run_id, dry_run=context.dry_run, options=options,
                                  lease_token=self.lease.token if self.lease else None)
            crm = yield from self._steps(context, counts)
            status = self._final_status(context, counts)
        except _CheckFailed as exc:
            error = str(exc)
        except (SourceError, ConfigError, NexusCrmError, LeaseLost, MappingError, RunFailed, psycopg.Error,
                gexc.GoogleAPIError) as exc:
            error = sanitize_error_message(f"{type(exc).__name__}: {exc}")
            self._event("run_failed", context, level=logging.ERROR, error=error)
        except BaseException as exc:  # a bug or an interrupt: record it, then let it surface
            error = sanitize_error_message(f"{type(exc).__name__}: {exc}")
            self._finish(context, "failed", counts, error, crm)
            raise
        result = self._finish(context, status, counts, error, crm)
        yield result

    def _lease_held(self, context: JobContext, options: dict, holder: LeaseHolder | None) -> Iterator[Event]:
        """A live execution holds the job lease: the same run id is refused (its run row is
        not touched), another run id is skipped (`skipped_already_running`, see "The job lease" in docs/design/writeback-run.md), and
        both name the holder and when its lease ends."""
        held = f"the {self.job_name} lease: " + (holder.describe() if holder else "its holder released it meanwhile")
        if holder is not None and holder.run_id == context.run_id:
            message = (f"run {context.run_id} is already executing ({held}); wait for it to finish, or pick another "
                       "--run-id")
            self._event("run_refused", context, level=logging.WARNING, reason="run_id_executing")
            yield JobResult("failed", 0, 0, 0, 0, 0, error_message=message, lease_holder=holder)
            return
        message = f"another execution holds {held}"
        self.ledger.record_skipped(context.run_id, dry_run=False, options=options, message=message)
        self._event("run_skipped", context, level=logging.WARNING, reason="lease_held",
                    holder_run_id=holder.run_id if holder else None,
                    holder_execution_id=holder.execution_id if holder else None,
                    lease_expires_at=holder.expires_at.isoformat() if holder else None)
        yield Progress(f"skipped_already_running: {message}")
        yield JobResult("skipped_already_running", 0, 0, 0, 0, 0, error_message=message, lease_holder=holder)

    def _took_over(self, context: JobContext, claim: LeaseClaim) -> Progress:
        """This execution took the lease from dead executions; it says so once."""
        message = (f"took over the {self.job_name} lease and marked {', '.join(claim.abandoned)} abandoned: "
                   f"{claim.reason}; the rows it did not record stay retryable")
        self.took_over = message
        self._event("executions_abandoned", context, level=logging.WARNING, abandoned=list(claim.abandoned),
                    reason=claim.reason)
        return Progress(message)

    # -- steps ------------------------------------------------------------------------

    def _steps(self, context: JobContext, counts: _Counts) -> Iterator[Event]:
        yield from self._check_source(context)  # 3
        crm, table = yield from self._preflight_beside_candidates(context, counts)  # 4, 5
        yield from self._candidate_checks(context)  # 6a
        db_now = yield from self._validate(context, counts, table)  # 6b
        total_batches = math.ceil(counts.to_write / self.config.write.batch_size)
        yield Progress(f"validated {counts.selected} rows: {counts.to_write} to write in {total_batches} batches, "
                       f"{counts.unchanged} unchanged, {counts.deferred} waiting for their retry time")
        if context.dry_run or counts.to_write == 0:
            return crm  # nothing to send: no second pass over the candidates
        yield from self._write_pass(context, counts, crm, db_now, total_batches)  # 7, 8
        return crm

    def _check_source(self, context: JobContext) -> Iterator[Event]:
        """Step 3: readiness and freshness."""
        cfg = self.config
        started = time.perf_counter()
        readiness = run_readiness(self.bq, self.loaded.readiness_sql(), location=cfg.source.location,
                                  timer=self.warehouse)
        self.readiness = readiness
        self.ledger.set_source(context.run_id, readiness.source_run_id, readiness.as_of_at)
        now = self._db_now()
        age_minutes = round(readiness.age(now).total_seconds() / 60, 1)
        ready_meta = {"source_run_id": readiness.source_run_id, "as_of_at": readiness.as_of_at.isoformat()}
        yield self._stage(STAGE_READINESS, started, ready_meta)
        ready = CheckOutcome(CHECK_SOURCE_READY, readiness.ready,
                             "source is ready" if readiness.ready else
                             f"source not ready: {sanitize_error_message(readiness.reason or 'no reason given')}",
                             ready_meta)
        yield ready
        stale = freshness_problem(readiness, cfg.source.freshness_max_age_minutes, now)
        yield CheckOutcome(CHECK_SOURCE_FRESH, stale is None, stale or f"source is {age_minutes} minutes old",
                           {"age_minutes": age_minutes, "max_age_minutes": cfg.source.freshness_max_age_minutes})
        if not ready.passed:
            raise _CheckFailed(ready.description)
        if stale:
            raise _CheckFailed(stale)

    def _preflight_beside_candidates(self, context: JobContext, counts: _Counts) -> Iterator[Event]:
        """Steps 4 and 5 at once: the preflight's CRM calls run on a thread while the warehouse
        materializes the candidate table, so neither waits for the other. Nothing is written to
        the CRM either way, and a failed preflight fails the run as it did when it ran first
        (its error wins; the table is dropped in cleanup)."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="crm-preflight") as background:
            preflight = background.submit(self._preflight)
            try:
                table, candidates_done = self._materialize_candidates(context)
            finally:
                crm, preflight_done = preflight.result()
        counts.selected = table.row_count  # a run whose preflight failed selected nothing
        yield preflight_done
        yield candidates_done
        yield Progress(f"candidate table: {table.row_count} rows")
        return crm, table

    def _preflight(self) -> tuple[NexusCrmClient, StageDone]:
        """Step 4: authentication and the field contract, before anything is written."""
        started = time.perf_counter()
        crm = self.crm_factory(self.loaded)
        self._crm = crm
        crm.authenticate()
        crm.preflight(self.mapper.TARGET_OBJECT, self.mapper.FIELDS)
        self.api_usage = crm.api_usage
        return crm, self._stage(STAGE_PREFLIGHT, started, {"object": self.mapper.TARGET_OBJECT,
                                                            "crm_api_usage": str(self.api_usage or "unknown")})

    def _materialize_candidates(self, context: JobContext) -> tuple[CandidateTable, StageDone]:
        """Step 5: the run-scoped candidate table."""
        cfg = self.config
        started = time.perf_counter()
        self.table_id = candidate_table_id(cfg.state.project, cfg.state.dataset, self.job_name, context.run_id,
                                           self.execution_id)
        table = materialize_candidates(self.bq, self.table_id, self.loaded.source_sql(),
                                       external_ids=context.external_ids, location=cfg.source.location,
                                       timer=self.warehouse)
        self.reader = CandidateReader(self.bq, self.table_id, storage=self.storage, location=cfg.source.location,
                                      timer=self.warehouse)
        return table, self._stage(STAGE_CANDIDATES, started, {"rows": table.row_count})

    def _candidate_checks(self, context: JobContext) -> Iterator[Event]:
        """Step 6a: every canary id in the candidate table, and the set-based key checks."""
        cfg = self.config
        # Asked for by id (a canary): every id must be there; a row count cannot tell, since a
        # duplicated id can stand in for a missing one.
        missing = missing_external_ids(self.bq, self.table_id, context.external_ids, location=cfg.source.location,
                                       timer=self.warehouse) if context.external_ids else []
        if missing:
            raise RunFailed(f"{len(missing)} of the {len(set(context.external_ids))} external IDs asked for "
                            f"are not in the source: {', '.join(missing[:10])}" + (" ..." if len(missing) > 10 else ""))
        self._heartbeat()
        started = time.perf_counter()
        keys = check_keys(self.bq, self.table_id, location=cfg.source.location, timer=self.warehouse)
        yield self._stage(STAGE_KEYS, started)
        null_ok = keys.null_or_empty == 0
        yield CheckOutcome(CHECK_KEYS_NOT_NULL, null_ok,
                           "every external ID is present" if null_ok else
                           f"{keys.null_or_empty} rows have a null or empty _outbound_external_id",
                           {"rows": keys.rows, "null_or_empty": keys.null_or_empty})
        unique_ok = keys.duplicate_ids == 0
        yield CheckOutcome(CHECK_KEYS_UNIQUE, unique_ok,
                           "external IDs are unique" if unique_ok else
                           f"{keys.duplicate_ids} external IDs occur more than once",
                           {"duplicate_ids": keys.duplicate_ids,
                            "sample_id_hashes": [redact_id(x) for x in keys.duplicate_samples]})
        if not null_ok or not unique_ok:
            raise _CheckFailed("; ".join(c for c, ok in (
                (f"{keys.null_or_empty} null or empty external IDs", null_ok),
                (f"{keys.duplicate_ids} duplicate external IDs", unique_ok)) if not ok))

    def _validate(self, context: JobContext, counts: _Counts, table: CandidateTable) -> Iterator[Event]:
        """Step 6b: the no-write validation pass (every row mapped and hashed; it also counts
        what the write pass will send). Returns the database time the decisions used."""
        cfg = self.config
        started = time.perf_counter()
        schema_problems = self.mapper.schema_problems(table.schema)
        errors: list[str] = []
        error_count = 0
        db_now = self._db_now()
        if not schema_problems:
            for page in prefetch(self.reader.pages(self.page_size), self.prefetch_pages):  # the next page is read while this one maps
                mapped: list[MappedRecord] = []
                for row in page:
                    try:
                        mapped.append(self.mapper.map_record(row))
                    except MappingError as exc:
                        error_count += 1
                        if len(errors) < 10:
                            who = printable(exc.external_id) if exc.external_id else "?"
                            errors.append(f"row {who}: {exc}")
                states = self.ledger.read_states([m.external_id for m in mapped])
                for m in mapped:
                    decision = decide(m, states.get(m.external_id), now=db_now, force=context.force,
                                      retry_failed=context.retry_failed, skip_unchanged=cfg.write.skip_unchanged)
                    if decision == "write":
                        counts.to_write += 1
                    elif decision == "unchanged":
                        counts.unchanged += 1
                    else:
                        counts.deferred += 1
                self._heartbeat()
        if self.reader.refused:
            self._event("storage_read_refused", context, level=logging.WARNING,
                        error=sanitize_error_message(self.reader.refused))
            yield Progress(sanitize_error_message(self.reader.refused))
        valid = not schema_problems and error_count == 0
        description = ("every row maps inside the declared ownership" if valid else
                       "; ".join(schema_problems) if schema_problems else
                       f"{error_count} rows fail mapping: " + "; ".join(errors[:3]))
        yield self._stage(STAGE_VALIDATION, started, {"rows": counts.selected, "to_write": counts.to_write,
                                                      "unchanged": counts.unchanged, "deferred": counts.deferred,
                                                      "rows_failing_mapping": error_count,
                                                      "read_with": self.reader.path})
        yield CheckOutcome(CHECK_MAPPING, valid, description,
                           {"schema_problems": schema_problems, "rows_failing": error_count,
                            "first_errors": errors, "owned_fields": sorted(self.mapper.OWNED_FIELDS)})
        if not valid:
            raise _CheckFailed(description)
        self.ledger.set_selection(context.run_id, counts.selected, counts.unchanged + counts.deferred)
        return db_now

    def _write_pass(self, context: JobContext, counts: _Counts, crm: NexusCrmClient, now: datetime,
                    total_batches: int) -> Iterator[Event]:
        cfg = self.config
        size = cfg.write.batch_size
        ttl = timedelta(seconds=cfg.write.lease_ttl_seconds)
        mapping_s = [0.0]
        state_s = [0.0]

        gate = self._gate = Gate()

        def produce() -> Iterator[list[tuple[MappedRecord, RecordState | None]]]:
            # Runs on the prefetch thread: read a page, map it again, read its states. Each
            # page starts only while a CRM call is in flight (or the writer is starved), so
            # this thread's CPU work does not compete with the writer between two CRM calls.
            for page in gated(self.reader.pages(self.write_page_size), gate):
                t = time.perf_counter()
                mapped = [self.mapper.map_record(row) for row in page]
                mapping_s[0] += time.perf_counter() - t
                t = time.perf_counter()
                states = self.ledger_reader.read_states([m.external_id for m in mapped])
                state_s[0] += time.perf_counter() - t
                chosen = []
                for m in mapped:
                    prior = states.get(m.external_id)
                    if decide(m, prior, now=now, force=context.force, retry_failed=context.retry_failed,
                              skip_unchanged=cfg.write.skip_unchanged) == "write":
                        chosen.append((m, prior))
                yield chosen

        batch: list[tuple[MappedRecord, RecordState | None]] = []
        with _side_ledger(self.ledger) as reader, _side_ledger(self.ledger) as writer:
            self.ledger_reader, self.ledger_writer = reader, writer
            committer = Committer()
            try:
                for chosen in prefetch(produce(), self.prefetch_pages, gate):
                    self._heartbeat()  # pages with nothing to send must not let the lease lapse
                    for item in chosen:
                        batch.append(item)
                        if len(batch) == size:
                            yield from self._send(context, crm, batch, counts, total_batches, ttl, committer)
                            batch = []
                if batch:
                    yield from self._send(context, crm, batch, counts, total_batches, ttl, committer)
                yield from self._collect(context, counts, committer, total_batches)
            finally:
                self._drain(context, counts, committer)
        self._spent(STAGE_MAPPING, mapping_s[0])
        self.stage_seconds[STAGE_STATE_READ] = state_s[0]

    def _send(self, context: JobContext, crm: NexusCrmClient, batch: list[Pending], counts: _Counts,
              total_batches: int, ttl: timedelta, committer: Committer) -> Iterator[Event]:
        """Send one batch, then collect the previous batch's commit, check the lease and submit
        this one's commit: a batch's commit runs while the next batch is in flight. A batch
        whose answer stops the run is committed before the run stops."""
        cfg = self.config.write
        number = counts.batches + committer.pending + 1
        self._heartbeat()
        # A batch with records new to the ledger may need its read-back query too.
        self._check_headroom(number, total_batches, calls=1 + any(may_need_read_back(p) for _, p in batch))
        batch_id = f"{context.run_id}:{self.execution_id}:{number:06d}"
        started = time.perf_counter()
        if self._gate is not None:
            self._gate.set(crm=True)
        try:
            outcome = crm.upsert_batch(self.mapper.TARGET_OBJECT, self.mapper.EXTERNAL_ID_FIELD,
                                       [m.payload for m, _ in batch])
        finally:
            if self._gate is not None:
                self._gate.set(crm=False)
        read_back = self._read_back(crm, batch, outcome, counts)
        sent = _Sent(number, batch_id, len(batch), outcome, time.perf_counter() - started, settle(
            batch, outcome, base_backoff_s=cfg.base_backoff_seconds, max_backoff_s=cfg.max_backoff_seconds,
            read_back=read_back))
        self._spent(STAGE_CRM, sent.crm_seconds)
        self.api_usage = crm.api_usage or self.api_usage
        try:
            yield from self._collect(context, counts, committer, total_batches)
            self._hold_lease(number + 1)
        finally:  # this batch was sent: its evidence is committed even when the previous commit failed
            usage = self._usage_text()
            committer.submit(sent, self._shut_from_pages(lambda lease=self.lease, ledger=self.ledger_writer: (
                ledger.commit_batch(context.run_id, batch_id, lease, ttl, sent.settled.outcomes, sent.settled.counts,
                                    api_usage=usage))))
        if sent.settled.contradiction or outcome.stop_reason:
            yield from self._collect(context, counts, committer, total_batches)

    def _shut_from_pages(self, commit: Callable[[], Any]) -> Callable[[], Any]:
        """A batch commit that keeps the prefetch gate shut from now until it returns: a page
        read and mapped on the prefetch thread holds the interpreter for tens of milliseconds,
        and a commit overlapping it waited that long for its own turns (the commit's tail)."""
        gate = self._gate
        if gate is None:
            return commit
        gate.set(committing=True)

        def shut() -> Any:
            try:
                return commit()
            finally:
                gate.set(committing=False)

        return shut

    def _collect(self, context: JobContext, counts: _Counts, committer: Committer,
                 total_batches: int) -> Iterator[Event]:
        """Wait for the batch commit in flight, then count and report its batch; raises what
        the commit raised, or RunFailed when the batch's answer stops the run."""
        done = self._committed(committer)
        if done is None:
            return
        sent = self._count(context, counts, done)
        b, codes = sent.settled.counts, sent.settled.codes
        yield Progress(f"batch {sent.number}/{max(total_batches, sent.number)}: "
                       f"{b.succeeded} ok, {b.retryable_failed + b.permanently_failed} rejected"
                       + (f" ({', '.join(f'{k} x{v}' for k, v in sorted(codes.items()))})" if codes else ""))
        # The batch's evidence is committed; now the run stops if the CRM said it must.
        if sent.settled.contradiction:
            raise RunFailed(f"NexusCRM's answer to batch {sent.number} contradicts the ledger "
                            f"({sent.settled.contradiction}); its {sent.size} rows are left unaccounted (retryable) "
                            "and the run stopped: check the CRM or the gateway in front of it")
        if sent.outcome.stop_reason:
            raise RunFailed(f"batch {sent.number}: {sent.outcome.stop_reason}")

    def _drain(self, context: JobContext, counts: _Counts, committer: Committer) -> None:
        """The write pass is ending on an error: the last sent batch's commit is still waited
        for and counted, so the run row and the result agree with the ledger."""
        try:
            done = self._committed(committer)
            if done is not None:
                self._count(context, counts, done)
        except (LeaseLost, psycopg.Error) as exc:  # the error already ending the run is the one reported
            self._event("commit_failed", context, level=logging.ERROR, error=sanitize_error_message(str(exc)))
        finally:
            committer.close()

    def _committed(self, committer: Committer) -> Committed | None:
        """The commit in flight, waited for (the wait is counted even when it failed)."""
        started = time.perf_counter()
        try:
            done = committer.collect()
        finally:
            self._spent(STAGE_LEDGER_WAIT, time.perf_counter() - started)
        if done is not None:
            self.lease = done.result.lease
            self._last_renew = done.started
            self.ledger_commit_ms.append(done.seconds * 1000)
            self.ledger_commit_db_ms.append(done.result.db_seconds * 1000)
            self._spent(STAGE_LEDGER, done.seconds)
        return done

    def _count(self, context: JobContext, counts: _Counts, done: Committed) -> _Sent:
        sent: _Sent = done.tag
        settled, outcome, b = sent.settled, sent.outcome, sent.settled.counts
        counts.batches += 1
        counts.crm_calls += outcome.attempts
        counts.succeeded += b.succeeded
        counts.retryable += b.retryable_failed
        counts.permanent += b.permanently_failed
        counts.new_permanent += settled.new_permanent
        counts.blocking += len(settled.blocking)
        self.rejected += settled.rejected[:REJECTED_SAMPLE - len(self.rejected)]
        for external_id, code in settled.blocking:
            self._event("blocking_failure", context, level=logging.ERROR, batch_id=sent.batch_id, error_code=code,
                        external_id_hash=redact_id(external_id))
        self._event("batch_committed", context, batch_id=sent.batch_id, batch_size=sent.size, succeeded=b.succeeded,
                    retryable_failed=b.retryable_failed, permanently_failed=b.permanently_failed,
                    http_status=outcome.http_status, crm_attempts=outcome.attempts,
                    crm_ms=round(sent.crm_seconds * 1000), ledger_ms=round(done.seconds * 1000, 2),
                    ledger_db_ms=round(done.result.db_seconds * 1000, 2),
                    error_codes=settled.codes, batch_error=outcome.batch_error, crm_api_usage=self._usage_text())
        return sent

    def _read_back(self, crm: NexusCrmClient, batch: list[Pending], outcome: BatchWriteOutcome,
                   counts: _Counts) -> ReadBack | None:
        """The CRM's ids for the batch's successes the ledger cannot check (first-time
        creates), read by external id before any of them counts; None when there are none."""
        external_ids = read_back_ids(batch, outcome.results)
        if not external_ids:
            return None
        try:
            ids, calls = crm.ids_by_external_id(self.mapper.TARGET_OBJECT, self.mapper.EXTERNAL_ID_FIELD, external_ids)
        except NexusCrmError as exc:
            counts.read_back_calls += 1
            return ReadBack(error=sanitize_error_message(str(exc)))
        counts.read_back_calls += calls
        return ReadBack(ids)

    def _check_headroom(self, number: int, total_batches: int, calls: int) -> None:
        """Stop before the `calls` of a batch would use the share of the org's API allocation
        this job leaves to other integrations (`write.api_headroom_percent`)."""
        percent, usage = self.config.write.api_headroom_percent, self.api_usage
        if not percent or usage is None:
            return
        budget = int(usage.max * (100 - percent) / 100)
        if usage.used + calls > budget:
            raise RunFailed(f"stopped before batch {number}/{max(total_batches, number)}: NexusCRM reports "
                            f"{usage} API calls used and this job leaves the last {percent:g}% of the org's API "
                            f"allocation to other integrations (at most {budget} calls); the rows not sent stay as "
                            "they were")

    def _usage_text(self) -> str | None:
        return str(self.api_usage) if self.api_usage else None

    # -- helpers ----------------------------------------------------------------------

    def _final_status(self, context: JobContext, counts: _Counts) -> str:
        if context.dry_run:
            return "dry_run"
        if counts.retryable or counts.permanent or counts.deferred:
            return "completed_with_errors"
        return "succeeded"

    def _finish(self, context: JobContext, status: str, counts: _Counts, error: str | None,
                crm: NexusCrmClient | None) -> JobResult:
        started = time.perf_counter()
        crm = crm or getattr(self, "_crm", None)
        if crm is not None:
            self.api_usage = crm.api_usage or self.api_usage  # the last usage the CRM reported, on any call
            crm.close()
        if self.table_id:
            try:
                drop_candidates(self.bq, self.table_id)
            except Exception as exc:  # the 24 h expiration still removes it
                self._event("cleanup_failed", context, level=logging.WARNING, what="candidate_table",
                            error=sanitize_error_message(str(exc)))
        unchanged = counts.unchanged + counts.deferred
        try:
            self.ledger.finish_run(
                context.run_id, status, selected=counts.selected, unchanged=unchanged, succeeded=counts.succeeded,
                retryable=counts.retryable, permanent=counts.permanent, batches=counts.batches,
                crm_calls=counts.crm_calls, error_message=error, api_usage=self._usage_text())
            if status not in ("dry_run", "failed"):
                prune_attempts(self.ledger.conn, max_chunks=10)
        except psycopg.Error as exc:
            self._event("finish_failed", context, level=logging.ERROR, error=sanitize_error_message(str(exc)))
        finally:
            if self.lease is not None:
                try:
                    self.ledger.release_lease(self.lease)
                except psycopg.Error as exc:  # it expires on its own
                    self._event("cleanup_failed", context, level=logging.WARNING, what="lease",
                                error=sanitize_error_message(str(exc)))
                self.lease = None
        self.stage_seconds[STAGE_CLEANUP] = time.perf_counter() - started
        result = JobResult(
            status=status,  # type: ignore[arg-type]
            selected=counts.selected, unchanged=unchanged, succeeded=counts.succeeded,
            retryable_failed=counts.retryable, permanently_failed=counts.permanent,
            new_permanent_failures=counts.new_permanent, blocking_failures=counts.blocking,
            deferred=counts.deferred, would_write=counts.to_write, batches=counts.batches,
            crm_calls=counts.crm_calls, read_back_calls=counts.read_back_calls, error_message=error,
            stage_seconds=dict(self.stage_seconds),
            api_usage=self._usage_text(), rejected=tuple(self.rejected), took_over=self.took_over)
        self._event("run_finished", context, level=logging.INFO if status != "failed" else logging.ERROR,
                    status=status, selected=result.selected, unchanged=result.unchanged,
                    succeeded=result.succeeded, retryable_failed=result.retryable_failed,
                    permanently_failed=result.permanently_failed, batches=result.batches,
                    crm_calls=result.crm_calls, error=error)
        return result

    def _heartbeat(self, force: bool = False) -> bool:
        """Renew the lease when a quarter of its TTL has passed (raises LeaseLost); True when renewed."""
        if self.lease is None:
            return False
        ttl = timedelta(seconds=self.config.write.lease_ttl_seconds)
        if force or time.monotonic() - self._last_renew > ttl.total_seconds() / 4:
            self.lease = self.ledger.renew_lease(self.lease, ttl)
            self._last_renew = time.monotonic()
            return True
        return False

    def _hold_lease(self, number: int) -> None:
        """After a batch's answer, before batch `number` may be sent: the lease is renewed when
        due, else its token is checked (a read, nothing to commit), in place of the fencing
        verdict of the answered batch's commit, which runs while batch `number` is in flight.
        Raises LeaseLost."""
        started = time.perf_counter()
        try:
            if self.lease is not None and not self._heartbeat() and not leases.is_current(self.ledger.conn,
                                                                                          self.lease):
                raise LeaseLost(f"writeback lease {self.lease.name!r} was lost (token {self.lease.token}); stopped "
                                f"before batch {number}, record state left to the current holder")
        finally:
            self._spent(STAGE_LEASE, time.perf_counter() - started)

    def _db_now(self) -> datetime:
        return self.ledger.conn.execute("SELECT clock_timestamp()").fetchone()[0]

    def _stage(self, stage: str, started: float, metadata: dict | None = None) -> StageDone:
        seconds = time.perf_counter() - started
        self._spent(stage, seconds)
        return StageDone(stage, seconds, metadata or {})

    def _spent(self, stage: str, seconds: float) -> None:
        self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + seconds

    def _event(self, event: str, context: JobContext, level: int = logging.INFO, **fields: Any) -> None:
        log_event(self.log, event, level=level, job_name=self.job_name, run_id=context.run_id, **fields)


class _CheckFailed(RuntimeError):
    """A blocking check failed: the run stops before any write."""


class _side_ledger:
    """The ledger of this execution on a connection of its own, for the prefetch thread's
    state reads or the commit thread (a psycopg connection is not shared between threads)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.conn: psycopg.Connection | None = None

    def __enter__(self) -> Ledger:
        info = self.ledger.conn.info
        self.conn = psycopg.Connection.connect(info.dsn, password=info.password, autocommit=True,
                                               options=f"-c search_path={_search_path(self.ledger.conn)} -c timezone=UTC")
        return Ledger(self.conn, self.ledger.job_name, self.ledger.target_object, self.ledger.execution_id)

    def __exit__(self, *exc: object) -> None:
        if self.conn is not None:
            self.conn.close()


def _search_path(conn: psycopg.Connection) -> str:
    return conn.execute("SHOW search_path").fetchone()[0].replace(" ", "")


class WritebackJob:
    """A registered job bound to its config and services: the writeback `Job` protocol."""

    def __init__(self, name: str, mapper: Mapper, config: LoadedConfig, *, bq: bigquery.Client,
                 conn: psycopg.Connection, crm_factory: Callable[[LoadedConfig], NexusCrmClient] = default_crm_factory,
                 **runner_options: Any) -> None:
        self.name = name
        self._build = lambda: Runner(name, mapper, config, bq=bq, conn=conn, crm_factory=crm_factory,
                                     **runner_options)

    def validate(self, context: JobContext) -> None:
        """Steps 1-7 with no writes (a dry run); raises RunFailed when anything fails."""
        result = self._build().run(replace(context, dry_run=True))
        if result.status == "failed":
            raise RunFailed(result.error_message or "validation failed")

    def run(self, context: JobContext) -> JobResult:
        return self._build().run(context)
