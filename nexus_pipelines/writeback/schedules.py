"""One asset job and one schedule per registered writeback job, from its config's
cron and timezone; stopped by default (`schedule.paused: true`)."""

from __future__ import annotations

from dagster import AssetSelection, DefaultScheduleStatus, ScheduleDefinition, define_asset_job

from nexus_pipelines.writeback.config import LoadedConfig
from nexus_pipelines.writeback.registry import JobDefinition

CONCURRENCY_TAG = "nexus/writeback-job"


def writeback_job(definition: JobDefinition, assets_def):
    return define_asset_job(
        name=f"writeback_{definition.name}_job",
        selection=AssetSelection.assets(assets_def),
        tags={CONCURRENCY_TAG: definition.name},
        description=f"Run the {definition.name} writeback (lease, checks, batched upserts, ledger).",
    )


def writeback_schedule(definition: JobDefinition, job, loaded: LoadedConfig) -> ScheduleDefinition:
    schedule = loaded.config.schedule
    return ScheduleDefinition(
        name=f"writeback_{definition.name}_schedule",
        job=job,
        cron_schedule=schedule.cron,
        execution_timezone=schedule.timezone,
        default_status=DefaultScheduleStatus.STOPPED if schedule.paused else DefaultScheduleStatus.RUNNING,
        tags={CONCURRENCY_TAG: definition.name},
        description=f"{definition.name} on {schedule.cron} ({schedule.timezone})",
    )
