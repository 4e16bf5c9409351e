"""The Jira Cloud row of the static connector registry."""

from __future__ import annotations

from nexus_pipelines.connectors.core.registry import ConnectorSpec
from nexus_pipelines.connectors.jira.adapter import KIND, build
from nexus_pipelines.connectors.jira.config import JiraConfig

SPEC = ConnectorSpec(
    kind=KIND,
    schema_id="nexus.connectors.jira.v1",
    config_model=JiraConfig,
    credential_fields=("token",),
    build=build,
    permissions="an expiring API token with scopes (1-365 days) of a service account: scopes read:jira-work, "
                "write:jira-work and read:jira-user; in the one project only, Browse projects, Add comments and "
                "Transition issues",
)
