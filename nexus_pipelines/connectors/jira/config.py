"""The Jira Cloud registration's strict provider config."""

from __future__ import annotations

import re
import zoneinfo
from typing import Annotated, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from nexus_pipelines.credentials import check_reference
from nexus_pipelines.integrations.http import check_service_url

_CLOUD_ID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def _zone(name: str) -> str:
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{name!r} is not an IANA time zone name") from None
    return name


def _email(value: str) -> str:
    if not _EMAIL.match(value):
        raise ValueError("must be the account's email address")
    return value


class JiraConfig(BaseModel):
    """One Jira Cloud project, addressed by the site's cloud id and the project's numeric id.

    Requests go through Atlassian's API gateway (`<api_url>/ex/jira/<cloud_id>/rest/api/3`),
    which is where API tokens with scopes are accepted, with HTTP basic auth
    `email:token`. `site_url` only builds the browse links people click. JQL reads an
    absolute date in the time zone of the calling account's profile, so
    `jql_time_zone` must be that zone.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    api_url: str = Field(default="https://api.atlassian.com", description="Atlassian's API gateway.")
    cloud_id: Annotated[str, Field(pattern=_CLOUD_ID, description="The site's immutable cloud id "
                                   "(https://<site>.atlassian.net/_edge/tenant_info).")]
    site_url: str = Field(description="The site, e.g. https://acme.atlassian.net (browse links only).")
    project_id: Annotated[int, Field(gt=0, description="The project's immutable numeric id (not its key).")]
    done_status_id: Annotated[int, Field(gt=0, description="The status a close-back moves the issue to.")]
    jql_time_zone: Annotated[str, AfterValidator(_zone)] = Field(
        description="The IANA time zone of the calling account's profile (GET /rest/api/3/myself: timeZone); "
                    "every composition checks it.")
    email: Annotated[str, AfterValidator(_email)] = Field(description="The calling account's email (not a secret).")
    token: Annotated[str, AfterValidator(check_reference)] = Field(
        description="Credential reference, e.g. env:JIRA_TOKEN, to the service account's API token with scopes "
                    "read:jira-work, write:jira-work and read:jira-user (it expires after 1 to 365 days).")
    local_mode: bool = Field(default=False, description="Allow plain http to a loopback host (the simulator).")

    @model_validator(mode="before")
    @classmethod
    def _no_type_list(cls, data):
        if isinstance(data, dict) and "excluded_issue_type_ids" in data:
            raise ValueError("excluded_issue_type_ids is no longer read: sub-tasks are recognised from each "
                             "issue's own type (issuetype.subtask); remove the field and register again")
        return data

    @model_validator(mode="after")
    def _urls(self) -> Self:
        for name in ("api_url", "site_url"):
            try:
                check_service_url(getattr(self, name), local_mode=self.local_mode)
            except ValueError as exc:
                raise ValueError(f"{name} {exc}") from None
        return self

    @property
    def rest_prefix(self) -> str:
        """The path of the site's REST API v3 behind the gateway."""
        return f"/ex/jira/{self.cloud_id}/rest/api/3"
