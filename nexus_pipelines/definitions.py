"""The one Definitions object of the code location."""

from __future__ import annotations

from dagster import Definitions, EnvVar

from nexus_pipelines.control.resources import ControlPlaneResource
from nexus_pipelines.integrations.resources import BigQueryClientResource
from nexus_pipelines.settings import load_settings
from nexus_pipelines.workqueue.definitions import workqueue_defs
from nexus_pipelines.writeback.definitions import defs as writeback_defs


def build_resources() -> dict:
    settings = load_settings()
    return {
        "control_plane": ControlPlaneResource(dsn=EnvVar("NEXUS_PG_DSN")),
        "bigquery": BigQueryClientResource(
            project=settings.bq_project, location=settings.bq_location, emulator_url=settings.bq_emulator_url
        ),
    }


defs = Definitions.merge(
    Definitions(resources=build_resources()),
    workqueue_defs,
    writeback_defs,
)
