"""The tickets' Dagster definitions: one tickets asset per connector registration, its
triage-age check and reconciliation-sweep check (with the sweep job and its daily schedule),
the observation schedule and the proof job (resources come from the code location)."""

from collections.abc import Mapping

from dagster import AssetSelection, Definitions, ScheduleDefinition, define_asset_job

from nexus_pipelines.connectors.core.registration import Registration
from nexus_pipelines.settings import load_settings
from nexus_pipelines.tickets.assets import tickets_asset_specs, triage_age_check
from nexus_pipelines.tickets.jobs import record_proof_job, tickets_observe_job
from nexus_pipelines.tickets.sweep_checks import sweep_check, sweep_job_and_schedule


def build_ticket_defs(registrations: Mapping[str, Registration]) -> Definitions:
    registration_ids = sorted(registrations)
    check = triage_age_check(registration_ids, load_settings().triage_max_age_hours)
    schedules = [ScheduleDefinition(name="tickets_observe_every_10_minutes", job=tickets_observe_job,
                                    cron_schedule="*/10 * * * *")]
    if check is not None:
        check_job = define_asset_job("tickets_triage_check", selection=AssetSelection.checks(check),
                                     description="Warn while a connector ticket waits too long for triage.")
        schedules.append(ScheduleDefinition(name="tickets_triage_check_every_15_minutes", job=check_job,
                                            cron_schedule="*/15 * * * *"))
    checks = [check] if check is not None else []
    jobs = [record_proof_job, tickets_observe_job]
    swept = sweep_check(dict(registrations))
    if swept is not None:
        sweep_job, sweep_schedule = sweep_job_and_schedule(swept)
        checks.append(swept)
        jobs.append(sweep_job)
        schedules.append(sweep_schedule)
    return Definitions(
        assets=tickets_asset_specs(registration_ids),
        asset_checks=checks,
        jobs=jobs,
        schedules=schedules,
    )
