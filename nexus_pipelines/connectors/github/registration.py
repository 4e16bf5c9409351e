"""The GitHub row of the static connector registry."""

from __future__ import annotations

from nexus_pipelines.connectors.core.registry import ConnectorSpec
from nexus_pipelines.connectors.github.adapter import KIND, build
from nexus_pipelines.connectors.github.config import GitHubConfig

SPEC = ConnectorSpec(
    kind=KIND,
    schema_id="nexus.connectors.github.v1",
    config_model=GitHubConfig,
    credential_fields=("private_key",),
    build=build,
    permissions="a GitHub App installed on the one repository with repository permissions Issues: read and write "
                "and Metadata: read (no webhook); its private key behind the reference",
)
