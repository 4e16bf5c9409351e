"""`nexus-pipelines run-job`: the seed's Cloud Run Job command, running the job's asset
graph in process, with the section 11 exit codes (0 ok, 1 failed, 2 record errors)."""

from __future__ import annotations

import sys

import click


@click.command("run-job")
@click.option("--job", "job_name", required=True, help="Registered writeback job name, e.g. month_end_arr.")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Job config YAML (configs/jobs/<job>.yaml).")
@click.option("--dry-run", is_flag=True, help="Validate and count; write nothing to NexusCRM or the record ledger.")
@click.option("--run-id", default=None, help="Deterministic ledger run id for recovery or testing.")
@click.option("--retry-failed", is_flag=True, help="Send only rows whose current state is retryable_failed.")
@click.option("--external-id", "external_ids", multiple=True, help="Only this external ID (repeatable): canary or repair.")
@click.option("--force", is_flag=True, help="Send rows even when their payload hash is unchanged.")
def run_job(job_name: str, config_path: str, dry_run: bool, run_id: str | None, retry_failed: bool,
            external_ids: tuple[str, ...], force: bool) -> None:
    """Run one writeback job end to end (lease, checks, preflight, batched upserts, ledger)."""
    from nexus_pipelines.cli_common import UserError, control_dsn
    from nexus_pipelines.writeback.config import ConfigError, load_config
    from nexus_pipelines.writeback.execute import default_resources, run_in_process
    from nexus_pipelines.writeback.registry import UnknownJob, get_job

    try:
        get_job(job_name)
        load_config(config_path)
    except (UnknownJob, ConfigError) as exc:
        raise UserError(str(exc.args[0] if isinstance(exc, UnknownJob) else exc)) from None
    outcome = run_in_process(job_name, config_path, resources=default_resources(control_dsn()), dry_run=dry_run,
                             run_id=run_id, retry_failed=retry_failed, external_ids=external_ids, force=force)
    click.echo(outcome.summary())
    sys.exit(outcome.exit_code)
