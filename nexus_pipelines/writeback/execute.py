"""Run a writeback job's asset graph in this process (the seed's `run-job` shape):
used by `nexus-pipelines run-job` and the demo. Exit codes follow section 11."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dagster import DagsterInstance, materialize

from nexus_pipelines.writeback.assets import CRM_RESOURCE_KEY, asset_keys, build_writeback_assets, source_asset_spec
from nexus_pipelines.writeback.contract import EXIT_FAILED, EXIT_OK, EXIT_RECORD_ERRORS
from nexus_pipelines.writeback.registry import get_job
from nexus_pipelines.writeback.resources import NexusCrmWritebackResource
from nexus_pipelines.writeback.schedules import CONCURRENCY_TAG

COUNT_KEYS = ("selected", "unchanged", "succeeded", "retryable_failed", "permanently_failed",
              "new_permanent_failures", "blocking_failures", "deferred", "batches", "crm_calls", "would_write")


@dataclass(frozen=True)
class InProcessOutcome:
    job_name: str
    ledger_run_id: str
    dagster_run_id: str
    status: str
    exit_code: int
    counts: dict[str, int] = field(default_factory=dict)
    error: str | None = None

    def summary(self) -> str:
        parts = [f"{k}={self.counts[k]}" for k in COUNT_KEYS if k in self.counts]
        line = f"{self.job_name} run {self.ledger_run_id}: {self.status}" + (f" ({', '.join(parts)})" if parts else "")
        return line + (f": {self.error}" if self.error else "")


def default_resources(pg_dsn: str) -> dict[str, Any]:
    from nexus_pipelines.control.resources import ControlPlaneResource
    from nexus_pipelines.integrations.resources import BigQueryClientResource
    from nexus_pipelines.settings import load_settings

    settings = load_settings()
    return {
        "control_plane": ControlPlaneResource(dsn=pg_dsn),
        "bigquery": BigQueryClientResource(project=settings.bq_project, location=settings.bq_location,
                                           emulator_url=settings.bq_emulator_url),
        CRM_RESOURCE_KEY: NexusCrmWritebackResource(),
    }


def run_in_process(job_name: str, config_path: str | None, *, resources: dict[str, Any], dry_run: bool = False,
                   run_id: str | None = None, retry_failed: bool = False, external_ids: tuple[str, ...] = (),
                   force: bool = False, instance: DagsterInstance | None = None,
                   log_level: str = "INFO") -> InProcessOutcome:
    definition = get_job(job_name)
    keys = asset_keys(definition)
    op_config: dict[str, Any] = {"dry_run": dry_run, "retry_failed": retry_failed, "force": force,
                                 "external_ids": list(external_ids)}
    if config_path:
        op_config["config_path"] = str(config_path)
    if run_id:
        op_config["run_id"] = run_id
    assets = [source_asset_spec(definition), build_writeback_assets(definition)]
    result = materialize(
        assets, resources=resources, raise_on_error=False, instance=instance or DagsterInstance.ephemeral(),
        tags={CONCURRENCY_TAG: job_name},
        run_config={"ops": {f"writeback_{job_name}": {"config": op_config}},
                    "loggers": {"console": {"config": {"log_level": log_level}}}},
    )
    ledger_run_id = run_id or result.run_id
    crm = [e.event_specific_data.materialization for e in result.get_asset_materialization_events()
           if e.asset_key == keys["crm"]]
    crm += [e.event_specific_data.asset_observation for e in result.get_asset_observation_events()
            if e.asset_key == keys["crm"]]
    if crm:
        meta = crm[0].metadata
        counts = {k: int(meta[k].value) for k in COUNT_KEYS if k in meta}
        status = str(meta["status"].value)
        bad = sum(counts.get(k, 0) for k in ("retryable_failed", "deferred", "new_permanent_failures",
                                             "blocking_failures"))
        code = EXIT_RECORD_ERRORS if status == "completed_with_errors" and bad else EXIT_OK
        error = "another run holds the job lease" if status == "skipped_already_running" else None
        return InProcessOutcome(job_name, ledger_run_id, result.run_id, status, code, counts, error)
    failure = next((e for e in result.all_events if e.is_step_failure), None)
    message = None
    if failure is not None and failure.step_failure_data and failure.step_failure_data.user_failure_data:
        message = failure.step_failure_data.user_failure_data.description
    elif failure is not None and failure.step_failure_data and failure.step_failure_data.error:
        message = failure.step_failure_data.error.message.strip().splitlines()[-1]
    return InProcessOutcome(job_name, ledger_run_id, result.run_id, "failed", EXIT_FAILED, error=message)
