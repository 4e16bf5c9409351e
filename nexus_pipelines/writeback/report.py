"""The one-line reports a writeback run ends with, shared by Dagster, the CLI and the demo."""

from __future__ import annotations

from nexus_pipelines.writeback.contract import JobResult


def records_command(job_name: str, status: str) -> str:
    """The CLI command that lists every ledger record of `job_name` in `status`."""
    return f"nexus-pipelines writeback records --job {job_name} --status {status}"


def rejected_text(result: JobResult) -> str:
    return ", ".join(f"{external_id} {code}" for external_id, code in result.rejected)


def policy_summary(job_name: str, result: JobResult) -> str:
    """Why a run that ended with record errors exits non-zero (the exit-code rule of docs/design/writeback-run.md), its
    counts, the first rejected ids and how to list them all."""
    line = (f"{job_name} {result.status} (exit code {result.exit_code}): {result.succeeded} succeeded, "
            f"{result.permanently_failed} permanent ({result.new_permanent_failures} new, "
            f"{result.blocking_failures} blocking), {result.retryable_failed} retryable, "
            f"{result.deferred} waiting for retry")
    if result.rejected:
        line += f"; first rejected: {rejected_text(result)}"
    status = "permanent_failed" if result.permanently_failed else "retryable_failed"
    return f"{line}; list them all: {records_command(job_name, status)}"
