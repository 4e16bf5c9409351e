"""`nexus-pipelines run-job`: the writeback's Cloud Run Job command, running the job's asset
graph in process with the exit codes of docs/design/writeback-run.md (`JobResult.exit_code`: 0 ok, 1 failed,
2 record errors); and `nexus-pipelines writeback runs|records|attempts`, the ledger."""

from __future__ import annotations

import json
import sys
from datetime import datetime

import click

from nexus_pipelines.cli_common import UserError, control_connection, control_dsn

RUN_STATUSES = ("running", "succeeded", "completed_with_errors", "failed", "dry_run", "skipped_already_running",
                "abandoned")
RECORD_STATUSES = ("succeeded", "retryable_failed", "permanent_failed")
TABLE_CELL = 60  # widest table cell; --json has every value in full


def _run_id(value: str | None) -> str | None:
    import re

    from nexus_pipelines.writeback.contract import RUN_ID_PATTERN

    if value is not None and not re.match(RUN_ID_PATTERN, value):
        raise click.BadParameter("a run id is 1-128 letters, digits, '.', '_', ':' or '-', starting with a letter "
                                 "or digit", param_hint="--run-id")
    return value


@click.command("run-job")
@click.option("--job", "job_name", required=True, help="Registered writeback job name, e.g. month_end_arr.")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False, resolve_path=True),
              help="Job config YAML (configs/jobs/<job>.yaml).")
@click.option("--dry-run", is_flag=True, help="Validate and count; write nothing to NexusCRM or the record ledger.")
@click.option("--run-id", default=None, callback=lambda ctx, param, value: _run_id(value),
              help="Deterministic ledger run id for recovery or testing (letters, digits, . _ : -).")
@click.option("--retry-failed", is_flag=True, help="Send only rows whose current state is retryable_failed.")
@click.option("--external-id", "external_ids", multiple=True, help="Only this external ID (repeatable): canary or repair.")
@click.option("--force", is_flag=True, help="Send rows even when their payload hash is unchanged.")
def run_job(job_name: str, config_path: str, dry_run: bool, run_id: str | None, retry_failed: bool,
            external_ids: tuple[str, ...], force: bool) -> None:
    """Run one writeback job end to end (lease, checks, preflight, batched upserts, ledger)."""
    from nexus_pipelines.integrations.nexuscrm import NexusCrmConfigError
    from nexus_pipelines.writeback.config import ConfigError, load_config
    from nexus_pipelines.writeback.execute import default_resources, run_in_process, stored_instance
    from nexus_pipelines.writeback.registry import UnknownJob, get_job
    from nexus_pipelines.writeback.runner import crm_credentials

    # Everything a user can get wrong is one line before a Dagster run starts.
    try:
        get_job(job_name)
        crm_credentials(load_config(config_path))
    except (UnknownJob, ConfigError, NexusCrmConfigError) as exc:
        raise UserError(str(exc.args[0] if isinstance(exc, UnknownJob) else exc)) from None
    dsn = control_dsn()
    with control_connection(dsn):
        pass
    instance = stored_instance()
    # The console logger stays quiet (no Dagster traces): the summary below is the report.
    outcome = run_in_process(job_name, config_path, resources=default_resources(dsn), dry_run=dry_run,
                             run_id=run_id, retry_failed=retry_failed, external_ids=external_ids, force=force,
                             instance=instance, log_level="CRITICAL")
    click.echo(outcome.summary())
    where = "its events: `make dev`, Runs" if instance else "not kept: set DAGSTER_HOME to keep runs"
    click.echo(f"Dagster run {outcome.dagster_run_id} ({where})")
    sys.exit(outcome.exit_code)


@click.group("writeback")
def writeback() -> None:
    """The writeback ledger: runs, current record states and attempt evidence."""


def _listing_options(statuses: tuple[str, ...], *, external_id_help: str = "Only this external ID."):
    def decorate(command):
        options = [
            click.option("--job", default=None, help="Only this writeback job."),
            click.option("--status", type=click.Choice(statuses), default=None, help="Only this status."),
            click.option("--external-id", default=None, help=external_id_help),
            click.option("--run-id", default=None, help="Only this ledger run id."),
            click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000)),
            click.option("--json", "as_json", is_flag=True, help="One JSON array, every column in full."),
        ]
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


@writeback.command("runs")
@_listing_options(RUN_STATUSES, external_id_help="Only runs that sent this external ID (attempts are kept 90 days).")
def runs_cmd(job: str | None, status: str | None, external_id: str | None, run_id: str | None, limit: int,
             as_json: bool) -> None:
    """Writeback runs, one row per execution (a replayed run id has several), newest first, with
    their counts and the CRM API usage."""
    from nexus_pipelines.writeback.queries import RUNS

    _show(RUNS, "runs", ("job_name", "run_id", "execution_id", "status", "started_at", "selected_rows", "succeeded_rows",
                         "retryable_failed_rows", "permanently_failed_rows", "crm_calls", "crm_api_usage",
                         "error_message"), as_json,
          limit=limit, job=job, status=status, external_id=external_id, run_id=run_id)


@writeback.command("records")
@_listing_options(RECORD_STATUSES)
def records_cmd(job: str | None, status: str | None, external_id: str | None, run_id: str | None, limit: int,
                as_json: bool) -> None:
    """Current record states (by last attempt run with --run-id), most recently updated first."""
    from nexus_pipelines.writeback.queries import RECORDS

    _show(RECORDS, "records", ("job_name", "external_id", "status", "attempt_count", "crm_record_id", "error_code",
                               "next_retry_at", "last_attempt_run_id", "error_message"), as_json,
          limit=limit, job=job, status=status, external_id=external_id, run_id=run_id)


@writeback.command("attempts")
@_listing_options(RECORD_STATUSES)
def attempts_cmd(job: str | None, status: str | None, external_id: str | None, run_id: str | None, limit: int,
                 as_json: bool) -> None:
    """Attempt evidence (append-only, 90 days), newest first."""
    from nexus_pipelines.writeback.queries import ATTEMPTS

    _show(ATTEMPTS, "attempts", ("attempted_at", "job_name", "run_id", "external_id", "attempt_number", "status",
                                 "http_status", "error_code", "error_message"), as_json,
          limit=limit, job=job, status=status, external_id=external_id, run_id=run_id)


def _show(listing, what: str, table_columns: tuple[str, ...], as_json: bool, **query) -> None:
    from nexus_pipelines.writeback.queries import fetch

    with control_connection() as conn:
        rows = fetch(conn, listing, **query)
    if as_json:
        click.echo(json.dumps(rows, default=_json_value, sort_keys=True))
    elif not rows:
        click.echo(f"no writeback {what} match")
    else:
        click.echo(_table(rows, table_columns))


def _json_value(value: object) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _table(rows: list[dict], columns: tuple[str, ...]) -> str:
    """Aligned columns; cells on one line (control characters escaped), cut to TABLE_CELL."""
    from nexus_pipelines.redaction import printable

    def cell(value: object) -> str:
        text = "" if value is None else value.isoformat(timespec="seconds") if isinstance(value, datetime) else str(value)
        text = printable(" ".join(text.split()))
        return text if len(text) <= TABLE_CELL else text[:TABLE_CELL - 1] + "…"

    header = [c.removesuffix("_rows").replace("job_name", "job") for c in columns]
    body = [[cell(row[c]) for c in columns] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]
    lines = [header, *body]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in lines)
