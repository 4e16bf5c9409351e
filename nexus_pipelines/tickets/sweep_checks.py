"""The reconciliation sweep in Dagster: one `missed_by_incremental_scans` check per
registration's tickets asset, run by the `connectors_sweep` job (a daily schedule, running
by default: a deployment that never sweeps has no net under the incremental scans; from the
launchpad for chosen registrations, or by executing one check).

Each check result says `missed by incremental scans: N` (WARN when N > 0, ERROR when the
sweep could not finish), and the tickets asset gets an observation with the sweep's counts.
A registration whose revision is not the active one is not polled, so there is nothing to
sweep: its check passes saying so, with no provider call (a first start with registration
files that nobody activated yet raises no alarm).
"""

import os
import socket
import uuid

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetSelection,
    Config,
    DefaultScheduleStatus,
    MetadataValue,
    ScheduleDefinition,
    define_asset_job,
    multi_asset_check,
)
from pydantic import Field

from nexus_pipelines.connectors.core.compose import CachedComposer
from nexus_pipelines.connectors.core.executor import RetryExecutor
from nexus_pipelines.connectors.core.registration import Registration
from nexus_pipelines.connectors.core.registry import ComposeContext
from nexus_pipelines.connectors.core.sweep import SweepBounds, SweepReport, sweep
from nexus_pipelines.connectors.provider_gate import ProviderGates
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.connectors.sweeps import sources
from nexus_pipelines.control.resources import ControlPlaneResource
from nexus_pipelines.redaction import describe_exception
from nexus_pipelines.tickets.assets import tickets_asset_key, tickets_observation
from nexus_pipelines.tickets.queries import counts_by_registration

SWEEP_CHECK = "missed_by_incremental_scans"
SWEEP_JOB = "connectors_sweep"
SWEEP_SCHEDULE = "connectors_sweep_daily"


class SweepConfig(Config):
    registrations: list[str] | None = Field(
        default=None, description="Registration ids (tenant/key) or keys to sweep; every selected check's "
                                  "registration when unset.")
    max_pages: int = Field(default=SweepBounds.max_pages, ge=1, description="At most this many listing pages each.")
    time_budget_s: float = Field(default=SweepBounds.time_budget_s, gt=0, description="Listing time budget each.")


def sweep_result(rid: str, report: SweepReport) -> AssetCheckResult:
    missed = len(report.gaps)
    finished = report.outcome in ("complete", "partial", "inactive")
    description = f"missed by incremental scans: {missed}"
    if report.outcome == "inactive":
        description = f"not swept: {report.detail}"
    elif report.outcome != "complete":
        description += f" (sweep {report.outcome}: {report.detail})"
    return AssetCheckResult(
        asset_key=tickets_asset_key(rid), check_name=SWEEP_CHECK, passed=finished and missed == 0,
        severity=AssetCheckSeverity.WARN if finished else AssetCheckSeverity.ERROR, description=description[:1000],
        metadata={"missed": MetadataValue.int(missed), "reobserved": MetadataValue.int(len(report.reobserved)),
                  "listed": MetadataValue.int(report.listed), "recent": MetadataValue.int(report.recent),
                  "excluded": MetadataValue.int(report.excluded),
                  "pages": MetadataValue.int(report.pages),
                  "unchanged_pages": MetadataValue.int(report.unchanged_pages),
                  "calls": MetadataValue.int(report.calls),
                  "outcome": MetadataValue.text(report.outcome),
                  "missed_refs": MetadataValue.json([g.external_ref for g in report.gaps][:100])})


def _chosen(registrations: dict[str, Registration], config: SweepConfig,
            context: AssetCheckExecutionContext) -> list[Registration]:
    if config.registrations:
        unknown = [k for k in config.registrations
                   if not any(k in (rid, r.key) for rid, r in registrations.items())]
        if unknown:
            raise ValueError(f"no registration named {', '.join(unknown)} in configs/connectors/ "
                             f"(known: {', '.join(sorted(registrations)) or 'none'})")
        return [r for rid, r in sorted(registrations.items()) if rid in config.registrations
                or r.key in config.registrations]
    selected = context.selected_asset_check_keys
    return [r for rid, r in sorted(registrations.items())
            if AssetCheckKey(tickets_asset_key(rid), SWEEP_CHECK) in selected]


def sweep_check(registrations: dict[str, Registration]):
    """One multi-check over every registration's tickets asset (None when there is none)."""
    if not registrations:
        return None
    specs = [AssetCheckSpec(SWEEP_CHECK, asset=tickets_asset_key(rid),
                            description="A reconciliation sweep lists the provider's issues and re-observes every one "
                                        "the incremental scans missed; warns when it found any.")
             for rid in sorted(registrations)]

    @multi_asset_check(specs=specs, name="connectors_sweep_check", can_subset=True,
                       description="Reconciliation sweep: provider listing vs custody, gaps re-observed.")
    def check(context: AssetCheckExecutionContext, config: SweepConfig, control_plane: ControlPlaneResource):
        chosen = _chosen(registrations, config, context)
        composer = CachedComposer(REGISTRY, ComposeContext(gates=ProviderGates(control_plane.pool())))
        run_id = context.op_execution_context.run_id
        owner = f"dagster-sweep:{run_id[:8]}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        bounds = SweepBounds(max_pages=config.max_pages, time_budget_s=config.time_budget_s)
        try:
            with control_plane.connection() as conn:
                for registration in chosen:
                    rid = registration.registration_id
                    try:
                        report = sweep(conn, REGISTRY, registration, sources(composer), owner=owner,
                                       executor=RetryExecutor(), bounds=bounds,
                                       on_page=lambda r: context.log.info(f"{r.registration_id}: page {r.pages}, "
                                                                          f"{r.listed} listed"))
                    except Exception as exc:  # noqa: BLE001 - one registration's composition must not stop the rest
                        report = SweepReport(rid, registration.revision_id, outcome="failed",
                                             detail=describe_exception(exc, 300))
                    context.log.info(report.line())
                    context.op_execution_context.log_event(tickets_observation(
                        rid, counts_by_registration(conn).get(rid), sweep_listed=report.listed,
                        sweep_missed=len(report.gaps), sweep_reobserved=len(report.reobserved),
                        sweep_calls=report.calls, sweep_outcome=report.outcome))
                    yield sweep_result(rid, report)
        finally:
            composer.close()

    return check


def sweep_job_and_schedule(check):
    job = define_asset_job(SWEEP_JOB, selection=AssetSelection.checks(check),
                           description="Reconciliation sweep of connector registrations (see the README).")
    schedule = ScheduleDefinition(name=SWEEP_SCHEDULE, job=job, cron_schedule="17 3 * * *",
                                  default_status=DefaultScheduleStatus.RUNNING,
                                  description="Sweep every registration once a day (03:17 UTC).")
    return job, schedule
