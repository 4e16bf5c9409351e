"""The GitLab row of the static connector registry."""

from __future__ import annotations

from nexus_pipelines.connectors.core.registry import ConnectorSpec
from nexus_pipelines.connectors.gitlab.adapter import KIND, build
from nexus_pipelines.connectors.gitlab.config import GitLabConfig

SPEC = ConnectorSpec(
    kind=KIND,
    schema_id="nexus.connectors.gitlab.v1",
    config_model=GitLabConfig,
    credential_fields=("token",),
    build=build,
    permissions="an expiring project access token of the one project: role Planner (read, comment on and close "
                "issues), scope api",
)
