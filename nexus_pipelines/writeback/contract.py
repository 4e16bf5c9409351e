"""The minimal job contract and the run exit policy (docs/design/writeback-run.md, "Job contract and replay options"
and "Exit codes")."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from nexus_pipelines.writeback.ledger import LeaseHolder

RunStatus = Literal["succeeded", "completed_with_errors", "failed", "dry_run", "skipped_already_running"]
TERMINAL_STATUSES: frozenset[str] = frozenset(
    {"succeeded", "completed_with_errors", "failed", "dry_run", "skipped_already_running"}
)

EXIT_OK = 0
EXIT_FAILED = 1  # infrastructure, auth, schema, source or lease failures
EXIT_RECORD_ERRORS = 2  # remaining retryable failures, or new/payload-changed permanent failures


# A ledger run id names a run in logs, the ledger and the candidate table: printable, one token.
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"


@dataclass(frozen=True)
class JobContext:
    run_id: str
    started_at: datetime
    dry_run: bool
    # Operational replay options; all off for a scheduled run.
    external_ids: tuple[str, ...] = ()
    retry_failed: bool = False
    force: bool = False


@dataclass(frozen=True)
class JobResult:
    status: RunStatus
    selected: int
    unchanged: int  # skipped rows: unchanged payloads, plus `deferred` retryable rows not yet due
    succeeded: int
    retryable_failed: int
    permanently_failed: int
    # Beyond the minimal contract: what the exit policy and the run metadata need.
    new_permanent_failures: int = 0
    blocking_failures: int = 0
    deferred: int = 0  # retryable rows whose next_retry_at lies in the future
    would_write: int = 0  # dry runs: rows a real run would send
    batches: int = 0
    crm_calls: int = 0  # upsert requests
    read_back_calls: int = 0  # queries reading the ids of first-time creates back by external id
    error_message: str | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)
    api_usage: str | None = None  # the CRM's last Sforce-Limit-Info api-usage, "N/M"
    rejected: tuple[tuple[str, str], ...] = ()  # the first rejected external IDs with their error codes
    lease_holder: LeaseHolder | None = None  # skipped or refused: the live execution holding the job lease
    took_over: str | None = None  # the dead executions this one took the job lease from, and why

    @property
    def exit_code(self) -> int:
        return exit_code(self)


def exit_code(result: JobResult) -> int:
    """The exit-code rule: 0 for succeeded, dry_run and skipped_already_running; non-zero for
    failures, remaining retryable failures and new or payload-changed permanent ones.
    Unchanged permanent failures (skipped rows) never re-alert."""
    if result.status == "failed":
        return EXIT_FAILED
    if result.status in ("succeeded", "dry_run", "skipped_already_running"):
        return EXIT_OK
    if result.retryable_failed or result.deferred or result.new_permanent_failures or result.blocking_failures:
        return EXIT_RECORD_ERRORS
    return EXIT_OK


@runtime_checkable
class Job(Protocol):
    name: str

    def validate(self, context: JobContext) -> None: ...

    def run(self, context: JobContext) -> JobResult: ...
