"""The writeback's Definitions: per registered job an asset graph, its asset job and a
(stopped) schedule; plus the ledger export to BigQuery and attempt-retention pruning."""

from dagster import AssetExecutionContext, AssetKey, Config, Definitions, Failure, MaterializeResult, MetadataValue, asset
from pydantic import Field


from nexus_pipelines.writeback.assets import GROUP, build_writeback_assets, source_asset_spec
from nexus_pipelines.writeback.config import load_config
from nexus_pipelines.writeback.export import LedgerExportError, export_ledger
from nexus_pipelines.writeback.ledger import prune_attempts
from nexus_pipelines.writeback.registry import JOBS
from nexus_pipelines.writeback.resources import NexusCrmWritebackResource
from nexus_pipelines.writeback.schedules import writeback_job, writeback_schedule


class LedgerExportConfig(Config):
    project: str | None = Field(default=None, description="BigQuery project; defaults to the bigquery resource's.")
    dataset: str = Field(default="nexuscrm_control", description="The control dataset.")


@asset(key=AssetKey(["nexuscrm_control", "ledger_export"]), group_name=GROUP,
       required_resource_keys={"control_plane", "bigquery"}, kinds={"bigquery", "postgres"},
       description="The four writeback ledger tables copied from the Postgres control plane to the BigQuery "
                   "control dataset by load jobs: leases, runs and records replaced whole, the attempts committed "
                   "since the last export appended.")
def writeback_ledger_export(context: AssetExecutionContext, config: LedgerExportConfig) -> MaterializeResult:
    with context.resources.bigquery.get_client() as bq, context.resources.control_plane.connection() as conn:
        try:
            counts = export_ledger(conn, bq, config.project or bq.project, config.dataset)
        except LedgerExportError as exc:
            raise Failure(description=str(exc)) from None
    return MaterializeResult(metadata={f"{k}_rows": MetadataValue.int(v) for k, v in counts.items()})


@asset(key=AssetKey(["nexuscrm_control", "attempt_retention"]), group_name=GROUP,
       required_resource_keys={"control_plane"}, kinds={"postgres"},
       description="Deletes writeback attempt evidence older than 90 days.")
def writeback_attempt_retention(context: AssetExecutionContext) -> MaterializeResult:
    with context.resources.control_plane.connection() as conn:
        deleted = prune_attempts(conn)
    return MaterializeResult(metadata={"deleted": MetadataValue.int(deleted)})


def build_definitions() -> Definitions:
    assets, jobs, schedules = [], [], []
    for definition in JOBS.values():
        writeback = build_writeback_assets(definition)
        job = writeback_job(definition, writeback)
        assets += [source_asset_spec(definition), writeback]
        jobs.append(job)
        schedules.append(writeback_schedule(definition, job, load_config(definition.config_path)))
    return Definitions(
        assets=[*assets, writeback_ledger_export, writeback_attempt_retention],
        jobs=jobs,
        schedules=schedules,
        resources={"nexuscrm_writeback": NexusCrmWritebackResource()},
    )


defs = build_definitions()
