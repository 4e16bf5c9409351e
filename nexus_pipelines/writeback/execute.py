"""Run a writeback job's asset graph in this process (the `run-job` command's shape), under
the job's own name (`writeback_<job>_job`): used by `nexus-pipelines run-job` and the
demo. The exit code is the run's `JobResult.exit_code`, carried in the metadata of the
NexusCRM asset or of the step's failure; it is never recomputed here."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from dagster import DagsterEvent, DagsterInstance, Definitions

from nexus_pipelines.writeback.assets import CRM_RESOURCE_KEY, asset_keys, build_writeback_assets, source_asset_spec
from nexus_pipelines.writeback.contract import EXIT_FAILED
from nexus_pipelines.writeback.registry import get_job
from nexus_pipelines.writeback.resources import NexusCrmWritebackResource
from nexus_pipelines.writeback.schedules import writeback_job

COUNT_KEYS = ("selected", "unchanged", "succeeded", "retryable_failed", "permanently_failed",
              "new_permanent_failures", "blocking_failures", "deferred", "batches", "crm_calls", "read_back_calls", "would_write")


@dataclass(frozen=True)
class InProcessOutcome:
    job_name: str
    ledger_run_id: str
    dagster_run_id: str
    status: str
    exit_code: int
    counts: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    rejected: tuple[tuple[str, str], ...] = ()
    took_over: str | None = None  # the dead executions this run took the job lease from

    def summary(self) -> str:
        parts = [f"{k}={self.counts[k]}" for k in COUNT_KEYS if k in self.counts]
        line = f"{self.job_name} run {self.ledger_run_id}: {self.status}" + (f" ({', '.join(parts)})" if parts else "")
        line += f": {self.error}" if self.error else ""
        return line + (f" ({self.took_over})" if self.took_over else "")


def default_resources(pg_dsn: str) -> dict[str, Any]:
    from nexus_pipelines.control.resources import ControlPlaneResource
    from nexus_pipelines.integrations.resources import WarehouseResource
    from nexus_pipelines.settings import load_settings

    settings = load_settings()
    return {
        "control_plane": ControlPlaneResource(dsn=pg_dsn),
        "bigquery": WarehouseResource(project=settings.bq_project, location=settings.bq_location,
                                     emulator_url=settings.bq_emulator_url),
        CRM_RESOURCE_KEY: NexusCrmWritebackResource(),
    }


def stored_instance() -> DagsterInstance | None:
    """The DAGSTER_HOME instance (the runs then show in `make dev`), or None without one."""
    if not os.environ.get("DAGSTER_HOME"):
        return None
    try:
        return DagsterInstance.get()
    except Exception:  # noqa: BLE001 - an unusable DAGSTER_HOME: the run is simply not kept
        return None


def run_in_process(job_name: str, config_path: str | None, *, resources: dict[str, Any], dry_run: bool = False,
                   run_id: str | None = None, retry_failed: bool = False, external_ids: tuple[str, ...] = (),
                   force: bool = False, instance: DagsterInstance | None = None,
                   log_level: str = "INFO") -> InProcessOutcome:
    definition = get_job(job_name)
    assets_def = build_writeback_assets(definition)
    job = writeback_job(definition, assets_def)
    defs = Definitions(assets=[source_asset_spec(definition), assets_def], jobs=[job], resources=resources)
    op_config: dict[str, Any] = {"dry_run": dry_run, "retry_failed": retry_failed, "force": force,
                                 "external_ids": list(external_ids)}
    if config_path:
        op_config["config_path"] = str(config_path)
    if run_id:
        op_config["run_id"] = run_id
    result = defs.resolve_job_def(job.name).execute_in_process(
        instance=instance or DagsterInstance.ephemeral(), raise_on_error=False,
        run_config={"ops": {f"writeback_{job_name}": {"config": op_config}},
                    "loggers": {"console": {"config": {"log_level": log_level}}}},
    )
    ledger_run_id = run_id or result.run_id
    failure = next((e.step_failure_data for e in result.all_events if e.is_step_failure), None)
    meta = _result_metadata(result.all_events, asset_keys(definition)["crm"], failure)
    if meta is None:  # the op raised before the runner reported (a bug or a bad config)
        return InProcessOutcome(job_name, ledger_run_id, result.run_id, "failed", EXIT_FAILED,
                                error=_failure_text(failure))
    counts = {k: int(meta[k].value) for k in COUNT_KEYS if k in meta}
    # A failed run's error as the runner put it (the step's failure names the run again), why
    # record errors exit non-zero, or else the runner's message.
    runner_error = str(meta["error"].value) if "error" in meta else None
    error = (runner_error if meta["status"].value == "failed" else None) or _failure_text(failure) or runner_error
    rejected = tuple(tuple(pair) for pair in meta["first_rejected"].value)
    took_over = str(meta["took_over"].value) if "took_over" in meta else None
    return InProcessOutcome(job_name, ledger_run_id, result.run_id, str(meta["status"].value),
                            int(meta["exit_code"].value), counts, error, rejected, took_over)


def _result_metadata(events: list[DagsterEvent], crm_key, failure) -> dict | None:
    """The runner's result metadata: on the step's failure, else on the NexusCRM asset."""
    if failure is not None:
        data = failure.user_failure_data
        return data.metadata if data is not None and "exit_code" in data.metadata else None
    for event in events:
        if event.is_step_materialization and event.asset_key == crm_key:
            return event.event_specific_data.materialization.metadata
        if event.event_type_value == "ASSET_OBSERVATION" and event.asset_key == crm_key:
            return event.event_specific_data.asset_observation.metadata
    return None


def _failure_text(failure) -> str | None:
    if failure is None:
        return None
    if failure.user_failure_data is not None:
        return failure.user_failure_data.description
    return failure.error.message.strip().splitlines()[-1] if failure.error else None
