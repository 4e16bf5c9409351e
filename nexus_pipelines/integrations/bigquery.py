"""BigQuery client construction: real BigQuery with Application Default Credentials,
or the local emulator with anonymous credentials when an emulator URL is given."""

from __future__ import annotations

from google.cloud import bigquery


def make_bigquery_client(project: str, location: str, emulator_url: str | None = None) -> bigquery.Client:
    if not emulator_url:
        return bigquery.Client(project=project, location=location)
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    return bigquery.Client(
        project=project,
        location=location,
        credentials=AnonymousCredentials(),
        client_options=ClientOptions(api_endpoint=emulator_url),
    )
