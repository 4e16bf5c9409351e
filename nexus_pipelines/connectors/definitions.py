"""The connectors' Dagster definitions: the poll job and its sensor (resources, among them
the poll's `ticket_observer`, come from the code location)."""

from dagster import Definitions

from nexus_pipelines.connectors.jobs import connectors_poll_job
from nexus_pipelines.connectors.sensors import connectors_poll_sensor


def build_connector_defs() -> Definitions:
    return Definitions(jobs=[connectors_poll_job], sensors=[connectors_poll_sensor])
