"""The one Definitions object of the code location.

Domains are imported as modules, not as their Definitions objects: Dagster refuses a
module that holds more than one Definitions at module scope.
"""

from __future__ import annotations

import warnings

from dagster import BetaWarning, Definitions, EnvVar

# Dagster's own sensor decorator passes its beta `owners` parameter; nobody here can act on it.
warnings.filterwarnings("ignore", message="Parameter `owners`", category=BetaWarning)

from nexus_pipelines.control.resources import ControlPlaneResource  # noqa: E402 - after the warning filter
from nexus_pipelines.integrations.resources import WarehouseResource
from nexus_pipelines.settings import load_settings
from nexus_pipelines import bindings
from nexus_pipelines.connectors.definitions import build_connector_defs
from nexus_pipelines.connectors.registry import load_registrations
from nexus_pipelines.tickets.assets import TicketObserver
from nexus_pipelines.tickets.definitions import build_ticket_defs
from nexus_pipelines.workqueue.definitions import build_workqueue_defs
from nexus_pipelines.writeback import definitions as writeback


def build_resources() -> dict:
    settings = load_settings()
    return {
        "control_plane": ControlPlaneResource(dsn=EnvVar("NEXUS_PG_DSN")),
        "bigquery": WarehouseResource(
            project=settings.bq_project, location=settings.bq_location, emulator_url=settings.bq_emulator_url
        ),
        "ticket_observer": TicketObserver(),
    }


defs = Definitions.merge(
    Definitions(resources=build_resources()),
    build_workqueue_defs(bindings.build_handler_registry, bindings.build_route_table, bindings.QUEUE_CLASSES),
    writeback.defs,
    build_connector_defs(),
    build_ticket_defs(load_registrations()),
)
