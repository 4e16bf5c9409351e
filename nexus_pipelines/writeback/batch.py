"""One API batch's answer turned into ledger evidence (docs/design/writeback-run.md,
"Reading the CRM's answer" and "Retry and failure policy").

`settle` decides each record's new state and retry time from the CRM's result and the
record's prior state. Salesforce returns results by position and nothing in a result
names its record, so before any result is believed it is checked against what the
ledger already knows (`contradiction`): a returned id that another record of the batch
owns, an update that returns another id than the one the ledger holds, a record
"created" with the id the ledger already holds, or one id answered twice. A success for
a record whose id the ledger does not hold yet (a first-time create, mostly) has nothing
in the ledger to be checked against, so the runner reads those records' ids back from
the CRM by external id (`needs_read_back`, `ReadBack`) and a success the CRM does not
hold as answered is a contradiction too. On any contradiction the whole batch is
unaccounted: retryable, never success, and a blocking alert.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nexus_pipelines.backoff import capped_exponential
from nexus_pipelines.integrations.nexuscrm import (
    BatchWriteOutcome,
    RecordWriteResult,
    is_blocking,
    sanitize_error_message,
)
from nexus_pipelines.writeback.ledger import AttemptOutcome, BatchCounts, RecordState
from nexus_pipelines.writeback.mapping import MappedRecord

Pending = tuple[MappedRecord, RecordState | None]


@dataclass
class Settlement:
    outcomes: list[AttemptOutcome] = field(default_factory=list)
    counts: BatchCounts = field(default_factory=BatchCounts)
    new_permanent: int = 0
    blocking: list[tuple[str, str]] = field(default_factory=list)  # (external id, error code)
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (external id, error code), in order
    codes: dict[str, int] = field(default_factory=dict)
    contradiction: str | None = None


@dataclass(frozen=True)
class ReadBack:
    """The CRM record ids NexusCRM holds for the batch's `needs_read_back` records (by
    external id), or why they could not be read."""

    ids: Mapping[str, str] = field(default_factory=dict)
    error: str | None = None


def may_need_read_back(prior: RecordState | None) -> bool:
    """The ledger holds no CRM id for the record yet: a success for it cannot be checked."""
    return prior is None or prior.crm_record_id is None


def needs_read_back(prior: RecordState | None, result: RecordWriteResult) -> bool:
    """A success the ledger cannot check."""
    return result.success and may_need_read_back(prior)


def read_back_ids(batch: list[Pending], results: tuple[RecordWriteResult, ...]) -> list[str]:
    """The external ids of the batch whose answered ids must be read back before they count."""
    return [m.external_id for (m, prior), r in zip(batch, results, strict=True) if needs_read_back(prior, r)]


def contradiction(batch: list[Pending], results: tuple[RecordWriteResult, ...],
                  read_back: ReadBack | None = None) -> str | None:
    """Why the CRM's answer cannot be matched to the batch by position, or None."""
    return _against_ledger(batch, results) or _against_read_back(batch, results, read_back)


def _against_read_back(batch: list[Pending], results: tuple[RecordWriteResult, ...],
                       read_back: ReadBack | None) -> str | None:
    if read_back is None:
        return None
    if read_back.error:
        return f"the ids it answered for records new to the ledger could not be read back ({read_back.error})"
    for (m, prior), r in zip(batch, results, strict=True):
        held = read_back.ids.get(m.external_id)
        if needs_read_back(prior, r) and held != r.crm_record_id:
            return f"{m.external_id} was answered as {r.crm_record_id}, but NexusCRM holds {held or 'no record'} for it"
    return None


def _against_ledger(batch: list[Pending], results: tuple[RecordWriteResult, ...]) -> str | None:
    known = {m.external_id: prior.crm_record_id for m, prior in batch if prior is not None and prior.crm_record_id}
    owner = {crm_id: external_id for external_id, crm_id in known.items()}
    answered: dict[str, str] = {}
    for (m, _), r in zip(batch, results, strict=True):
        if not r.success or r.crm_record_id is None:
            continue
        crm_id, mine = r.crm_record_id, known.get(m.external_id)
        if crm_id in answered:
            return f"id {crm_id} was answered for both {answered[crm_id]} and {m.external_id}"
        answered[crm_id] = m.external_id
        if owner.get(crm_id, m.external_id) != m.external_id:
            return f"{m.external_id} got id {crm_id}, which the ledger holds for {owner[crm_id]}"
        if mine is not None and not r.created and crm_id != mine:
            return f"{m.external_id} was updated as {crm_id}, the ledger holds {mine}"
        if mine is not None and r.created and crm_id == mine:
            return f"{m.external_id} was created as {crm_id}, a record the ledger already holds"
    return None


def settle(batch: list[Pending], outcome: BatchWriteOutcome, *, base_backoff_s: float,
           max_backoff_s: float, read_back: ReadBack | None = None) -> Settlement:
    s = Settlement(contradiction=contradiction(batch, outcome.results, read_back))
    ok = retry = perm = 0
    for (m, prior), r in zip(batch, outcome.results, strict=True):
        same_payload = prior is not None and prior.payload_hash == m.payload_hash
        attempt = prior.attempt_count + 1 if same_payload else 1
        delay = None
        crm_id, code, message = r.crm_record_id, r.error_code, r.error_message
        if s.contradiction:
            status, crm_id, code = "retryable_failed", None, "UNACCOUNTED"
            message = sanitize_error_message(f"the CRM's answer contradicts the ledger ({s.contradiction}); "
                                             "the write may or may not have been applied")
            s.blocking.append((m.external_id, code))
        elif r.success:
            status = "succeeded"
        elif r.retryable:
            status = "retryable_failed"
        else:
            status = "permanent_failed"
            if not (same_payload and prior.status == "permanent_failed"):
                s.new_permanent += 1
            if is_blocking(code):
                s.blocking.append((m.external_id, code or ""))
        if status == "retryable_failed":
            retry += 1
            server_wait = None if s.contradiction else outcome.retry_after_s
            delay = server_wait if server_wait is not None else capped_exponential(attempt, base_backoff_s,
                                                                                     max_backoff_s)
        ok += status == "succeeded"
        perm += status == "permanent_failed"
        if code:
            s.codes[code] = s.codes.get(code, 0) + 1
            s.rejected.append((m.external_id, code))
        s.outcomes.append(AttemptOutcome(
            m.external_id, m.payload_hash, m.source_version, attempt, status, crm_id, outcome.http_status, code,
            message, outcome.duration_ms, delay))
    s.counts = BatchCounts(succeeded=ok, retryable_failed=retry, permanently_failed=perm, crm_calls=outcome.attempts)
    return s
