"""The warehouse as a Dagster resource: dagster-gcp's BigQueryResource (project, location,
credentials, shown on the UI's resource page), plus the emulator endpoint of the local stack."""

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from dagster_gcp import BigQueryResource
from google.cloud import bigquery
from pydantic import Field

from nexus_pipelines.integrations.bigquery import make_bigquery_client


class WarehouseResource(BigQueryResource):
    """BigQuery with Application Default Credentials (or `gcp_credentials`), or the local emulator
    with anonymous credentials when `emulator_url` is set. Each client is closed when its block ends."""

    emulator_url: str | None = Field(default=None, description="BigQuery emulator endpoint (local stack only).")

    @contextmanager
    def get_client(self) -> Iterator[bigquery.Client]:
        emulator = self.emulator_url
        source = nullcontext(make_bigquery_client(self.project, self.location, emulator)) if emulator else super().get_client()
        with source as client:
            try:
                yield client
            finally:
                client.close()

    def get_object_to_set_on_execution_context(self) -> "WarehouseResource":
        # dagster-gcp hands ops a generator here; ops get the resource and open a client per block.
        return self
