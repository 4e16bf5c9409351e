"""The connectors' Dagster definitions (resources come from the code location)."""

from dagster import Definitions, ScheduleDefinition

from nexus_pipelines.connectors.assets import tickets_asset_specs
from nexus_pipelines.connectors.jobs import connectors_poll_job, tickets_observe_job
from nexus_pipelines.connectors.registry import load_registrations
from nexus_pipelines.connectors.sensors import connectors_poll_sensor
from nexus_pipelines.tickets.jobs import record_proof_job


def build_connector_defs() -> Definitions:
    return Definitions(
        assets=tickets_asset_specs(load_registrations()),
        jobs=[connectors_poll_job, tickets_observe_job, record_proof_job],
        sensors=[connectors_poll_sensor],
        schedules=[ScheduleDefinition(name="tickets_observe_every_10_minutes", job=tickets_observe_job,
                                      cron_schedule="*/10 * * * *")],
    )
