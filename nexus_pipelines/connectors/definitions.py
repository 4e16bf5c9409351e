"""The connectors' Dagster definitions (resources come from the code location)."""

from dagster import AssetSelection, Definitions, ScheduleDefinition, define_asset_job

from nexus_pipelines.connectors.assets import tickets_asset_specs, triage_age_check
from nexus_pipelines.connectors.jobs import connectors_poll_job, tickets_observe_job
from nexus_pipelines.connectors.registry import load_registrations
from nexus_pipelines.connectors.sensors import connectors_poll_sensor
from nexus_pipelines.connectors.sweep_checks import sweep_check, sweep_job_and_schedule
from nexus_pipelines.settings import load_settings
from nexus_pipelines.tickets.jobs import record_proof_job


def build_connector_defs() -> Definitions:
    registrations = load_registrations()
    check = triage_age_check(registrations, load_settings().triage_max_age_hours)
    schedules = [ScheduleDefinition(name="tickets_observe_every_10_minutes", job=tickets_observe_job,
                                    cron_schedule="*/10 * * * *")]
    if check is not None:
        check_job = define_asset_job("tickets_triage_check", selection=AssetSelection.checks(check),
                                     description="Warn while a connector ticket waits too long for triage.")
        schedules.append(ScheduleDefinition(name="tickets_triage_check_every_15_minutes", job=check_job,
                                            cron_schedule="*/15 * * * *"))
    checks = [check] if check is not None else []
    jobs = [connectors_poll_job, tickets_observe_job, record_proof_job]
    swept = sweep_check(registrations)
    if swept is not None:
        sweep_job, sweep_schedule = sweep_job_and_schedule(swept)
        checks.append(swept)
        jobs.append(sweep_job)
        schedules.append(sweep_schedule)
    return Definitions(
        assets=tickets_asset_specs(registrations),
        asset_checks=checks,
        jobs=jobs,
        sensors=[connectors_poll_sensor],
        schedules=schedules,
    )
