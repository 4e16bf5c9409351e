"""The writeback as a Dagster asset graph, one per registered job.

    <job>/bigquery_source (external) -> <job>/source_readiness -> <job>/candidate_table
        -> <job>/validated_payloads -> nexuscrm/<TargetObject>

Design: the four materializable assets are one `multi_asset` (one op, one process).
A writeback run is one critical section: the job lease must be held from before
readiness to after the last batch, and the candidate table and the lease must be
cleaned up whatever happens. In one op that is a plain try/finally in
`Runner.execute()`: a failed check, an exception or a failed CRM call all end in the
same cleanup, and there is no window where a step boundary (or a step skipped after
a failed upstream) leaves a lease or a candidate table behind. A killed process
leaves a lease that expires after `write.lease_ttl_seconds` and a candidate table
that expires after 24 hours.

The blocking checks (`checks.writeback_check_specs`) are declared on the assets they
guard and their results are emitted as the run reaches them; a failed one ends the
op before the CRM preflight's first write, so the NexusCRM asset is not
materialized and the Dagster run fails. The UI shows the lineage, the checks with
their history, and per-batch progress in the run log.

Outputs are optional (`can_subset=True`) so that a run skipped because another holds
the lease succeeds with its checks shown as skipped, not missing; a selection of only
some of the assets is refused in one line, since the run is one critical section.
A run that fails, or ends with record errors (a non-zero exit code), fails in
Dagster with one line (`Failure`) whose metadata carries `JobResult.exit_code`.
"""


import logging

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    AssetSpec,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    multi_asset,
)
from pydantic import Field

from nexus_pipelines.writeback.checks import CHECK_ASSET, writeback_check_specs
from nexus_pipelines.writeback.config import ConfigError, LoadedConfig, load_config
from nexus_pipelines.writeback.contract import JobContext, JobResult
from nexus_pipelines.writeback.contract import RUN_ID_PATTERN
from nexus_pipelines.writeback.registry import JobDefinition
from nexus_pipelines.writeback.report import policy_summary
from nexus_pipelines.writeback.runner import (
    STAGE_CANDIDATES,
    STAGE_READINESS,
    STAGE_VALIDATION,
    CheckOutcome,
    Progress,
    Runner,
    StageDone,
)
from nexus_pipelines.writeback.source import storage_read_client

GROUP = "nexuscrm_writeback"
CRM_RESOURCE_KEY = "nexuscrm_writeback"


class WritebackRunConfig(Config):
    """Launchpad options for manual work (the replay options of docs/design/writeback-run.md)."""

    dry_run: bool = Field(default=False, description="Validate and count, write nothing to NexusCRM or the record ledger.")
    external_ids: list[str] = Field(default_factory=list, description="Only these external IDs (one-record or allow-listed canary).")
    retry_failed: bool = Field(default=False, description="Send only rows whose current state is retryable_failed, ignoring their backoff.")
    force: bool = Field(default=False, description="Send rows even when their payload hash is unchanged (still an idempotent upsert).")
    config_path: str | None = Field(default=None, description="Job config YAML; defaults to configs/jobs/<job>.yaml "
                                    "(configs/jobs/<job>.local.yaml on the local stack); a relative path is taken "
                                    "from the project root.")
    run_id: str | None = Field(default=None, pattern=RUN_ID_PATTERN,
                               description="Ledger run id for a deliberate replay; defaults to the Dagster run id.")


def asset_keys(definition: JobDefinition) -> dict[str, AssetKey]:
    mapper = definition.mapper()
    prefix = ["writeback", definition.name]
    return {
        "source": AssetKey([*prefix, "bigquery_source"]),
        "readiness": AssetKey([*prefix, "source_readiness"]),
        "candidates": AssetKey([*prefix, "candidate_table"]),
        "validated": AssetKey([*prefix, "validated_payloads"]),
        "crm": AssetKey(["nexuscrm", mapper.TARGET_OBJECT]),
    }


def source_asset_spec(definition: JobDefinition) -> AssetSpec:
    keys = asset_keys(definition)
    return AssetSpec(
        keys["source"], group_name=GROUP,
        description=f"The BigQuery source query of {definition.name} (sql/jobs/{definition.name}.sql); "
                    "maintained upstream, read by the writeback.",
        kinds={"bigquery"},
    )


def build_writeback_assets(definition: JobDefinition):
    keys = asset_keys(definition)
    mapper = definition.mapper()
    job = definition.name
    specs = [
        AssetSpec(keys["readiness"], deps=[keys["source"]], group_name=GROUP, skippable=True, kinds={"bigquery"},
                  description="Readiness row of the source: the authoritative upstream run and its as-of time."),
        AssetSpec(keys["candidates"], deps=[keys["readiness"]], group_name=GROUP, skippable=True, kinds={"bigquery"},
                  description="Run-scoped snapshot of the source query in the control dataset (24 h expiry, "
                              "deleted when the run ends)."),
        AssetSpec(keys["validated"], deps=[keys["candidates"]], group_name=GROUP, skippable=True, kinds={"python"},
                  description="Every candidate row mapped and hashed with no writes (never stored)."),
        AssetSpec(keys["crm"], deps=[keys["validated"]], group_name=GROUP, skippable=True, kinds={"salesforce"},
                  description=f"{mapper.TARGET_OBJECT} in NexusCRM, upserted by {mapper.EXTERNAL_ID_FIELD}.",
                  metadata={"owned_fields": MetadataValue.json(sorted(mapper.OWNED_FIELDS)),
                            "external_id_field": mapper.EXTERNAL_ID_FIELD}),
    ]
    check_asset_keys = {"readiness": keys["readiness"], "candidates": keys["candidates"], "validated": keys["validated"]}
    check_specs = writeback_check_specs(check_asset_keys)

    @multi_asset(
        name=f"writeback_{job}",
        specs=specs,
        check_specs=check_specs,
        can_subset=True,
        required_resource_keys={"control_plane", "bigquery", CRM_RESOURCE_KEY},
        op_tags={"nexus/writeback-job": job},
        description=definition.description,
    )
    def _writeback(context: AssetExecutionContext, config: WritebackRunConfig):
        if (set(context.selected_asset_keys) != {spec.key for spec in specs}
                or len(context.selected_asset_check_keys) != len(check_specs)):
            raise Failure(description=f"the {job} writeback runs as a whole (one lease, one candidate table): "
                                      f"materialize all of its assets, or launch writeback_{job}_job",
                          allow_retries=False)
        try:
            loaded = load_config(config.config_path or definition.default_config())
        except ConfigError as exc:
            raise Failure(description=str(exc)) from None
        yield from run_in_dagster(context, definition, loaded, config)

    return _writeback


def run_in_dagster(context: AssetExecutionContext, definition: JobDefinition, loaded: LoadedConfig,
                   config: WritebackRunConfig):
    keys = asset_keys(definition)
    run_id = config.run_id or context.run_id
    job_context = JobContext(run_id=run_id, started_at=_now(), dry_run=config.dry_run,
                             external_ids=tuple(config.external_ids), retry_failed=config.retry_failed,
                             force=config.force)
    crm_factory = getattr(context.resources, CRM_RESOURCE_KEY).factory()
    stage_to_asset = {STAGE_READINESS: "readiness", STAGE_CANDIDATES: "candidates", STAGE_VALIDATION: "validated"}
    result: JobResult | None = None
    log = _DagsterLogAdapter(context)
    warehouse = context.resources.bigquery
    # The local emulator does not publish its Storage Read endpoint: there the candidates are read with queries.
    with (warehouse.get_client() as bq,
          storage_read_client(bq, enabled=not getattr(warehouse, "emulator_url", None)) as storage,
          context.resources.control_plane.connection() as conn):
        runner = Runner(definition.name, definition.mapper(), loaded, bq=bq, conn=conn, storage=storage,
                        crm_factory=crm_factory, log=log)
        for event in runner.execute(job_context):
            if isinstance(event, Progress):
                context.log.info(event.message)
            elif isinstance(event, CheckOutcome):
                asset = CHECK_ASSET[event.name]
                yield AssetCheckResult(
                    asset_key=keys[asset], check_name=event.name, passed=event.passed,
                    severity=AssetCheckSeverity.ERROR, description=event.description,
                    metadata={k: _meta(v) for k, v in event.metadata.items()})
            elif isinstance(event, StageDone):
                name = stage_to_asset.get(event.stage)
                if name is not None:
                    meta = {k: _meta(v) for k, v in event.metadata.items()}
                    meta["duration_s"] = MetadataValue.float(round(event.seconds, 3))
                    meta["run_id"] = MetadataValue.text(run_id)
                    yield MaterializeResult(asset_key=keys[name], metadata=meta)
            elif isinstance(event, JobResult):
                result = event
    assert result is not None
    meta = result_metadata(result, run_id, runner)
    if result.status in ("succeeded", "completed_with_errors"):
        yield MaterializeResult(asset_key=keys["crm"], metadata=meta)
    elif result.status in ("dry_run", "skipped_already_running"):
        # Nothing was written: an observation, not a materialization of the CRM object.
        context.log_event(AssetObservation(asset_key=keys["crm"], metadata=meta))
    if result.status == "failed":
        raise Failure(description=f"{definition.name} run {run_id} failed: {result.error_message}", metadata=meta,
                      allow_retries=False)
    if result.exit_code != 0:
        # A non-zero exit code: the CRM object is materialized with its evidence, and
        # the run fails so that schedules and run-failure alerts see it. Unchanged permanent
        # failures alone give exit code 0 and are not re-alerted.
        raise Failure(description=policy_summary(definition.name, result), metadata=meta, allow_retries=False)


def result_metadata(result: JobResult, run_id: str, runner: Runner) -> dict:
    commits = sorted(runner.ledger_commit_ms)
    p95 = commits[min(len(commits) - 1, int(len(commits) * 0.95))] if commits else 0.0
    meta = {
        "status": MetadataValue.text(result.status),
        "exit_code": MetadataValue.int(result.exit_code),
        "run_id": MetadataValue.text(run_id),
        "selected": MetadataValue.int(result.selected),
        "unchanged": MetadataValue.int(result.unchanged),
        "succeeded": MetadataValue.int(result.succeeded),
        "retryable_failed": MetadataValue.int(result.retryable_failed),
        "permanently_failed": MetadataValue.int(result.permanently_failed),
        "new_permanent_failures": MetadataValue.int(result.new_permanent_failures),
        "blocking_failures": MetadataValue.int(result.blocking_failures),
        "deferred": MetadataValue.int(result.deferred),
        "batches": MetadataValue.int(result.batches),
        "crm_calls": MetadataValue.int(result.crm_calls),
        "read_back_calls": MetadataValue.int(result.read_back_calls),
        "ledger_commit_p95_ms": MetadataValue.float(round(p95, 2)),
        "stage_seconds": MetadataValue.json({k: round(v, 3) for k, v in result.stage_seconds.items()}),
        "crm_api_usage": MetadataValue.text(result.api_usage or "unknown"),
        "first_rejected": MetadataValue.json([list(pair) for pair in result.rejected]),
    }
    if result.error_message:
        meta["error"] = MetadataValue.text(result.error_message)
    if result.lease_holder is not None:
        holder = result.lease_holder
        meta["lease_holder_run_id"] = MetadataValue.text(holder.run_id)
        meta["lease_holder_execution_id"] = MetadataValue.text(holder.execution_id or "unknown")
        meta["lease_expires_at"] = MetadataValue.timestamp(holder.expires_at)
    if result.took_over:
        meta["took_over"] = MetadataValue.text(result.took_over)
    if result.status == "dry_run":
        meta["would_write"] = MetadataValue.int(result.would_write)
    return meta


def _meta(value):
    if isinstance(value, bool):
        return MetadataValue.bool(value)
    if isinstance(value, int):
        return MetadataValue.int(value)
    if isinstance(value, float):
        return MetadataValue.float(value)
    if isinstance(value, (list, dict)):
        return MetadataValue.json(value)
    return MetadataValue.text(str(value))


def _now():
    from datetime import UTC, datetime

    return datetime.now(UTC)


class _DagsterLogAdapter(logging.Logger):
    """Routes the runner's structured JSON events into the Dagster run log."""

    def __init__(self, context: AssetExecutionContext) -> None:
        super().__init__("nexus_pipelines.writeback.dagster")
        self._context = context

    def log(self, level: int, msg, *args, **kwargs) -> None:  # type: ignore[override]
        if level >= logging.ERROR:
            self._context.log.error(msg)
        elif level >= logging.WARNING:
            self._context.log.warning(msg)
        else:
            self._context.log.debug(msg)
