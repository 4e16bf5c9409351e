"""The warehouse as a Dagster resource."""

from __future__ import annotations

from dagster import ConfigurableResource
from google.cloud import bigquery
from pydantic import Field

from nexus_pipelines.integrations.bigquery import make_bigquery_client


class BigQueryClientResource(ConfigurableResource):
    """google-cloud-bigquery clients: Application Default Credentials, or the emulator when its URL is set."""

    project: str = Field(description="Project that runs query jobs.")
    location: str = Field(default="US", description="Location of query jobs and datasets.")
    emulator_url: str | None = Field(default=None, description="BigQuery emulator endpoint (local stack only).")

    def get_client(self) -> bigquery.Client:
        return make_bigquery_client(self.project, self.location, self.emulator_url)
