"""The calling account's profile time zone, checked at every composition.

Jira reads an absolute JQL date as a wall time in the calling account's profile time zone,
and the adapter writes its scan bounds in `provider.jql_time_zone`. A zone east of the
profile's asks from hours in the future: nothing comes back, nothing fails, and the cursor
moves past every change. So each composition (each poll or drain run composes afresh)
reads `GET /rest/api/3/myself` and refuses a zone other than the profile's in one line
naming both; an administrator changing the profile's zone is caught by the next run.
"""

from __future__ import annotations

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nexus_pipelines.connectors.core.values import ConnectorAttempt
from nexus_pipelines.connectors.jira.config import JiraConfig
from nexus_pipelines.connectors.jira.limits import status_problem
from nexus_pipelines.connectors.provider_http import Deadline, Problem, send

COMPOSE_BUDGET_MS = 10_000
_WHAT = "reading the account's profile time zone (GET /rest/api/3/myself)"


class JiraAccountRefused(RuntimeError):
    """The account's zone is not the configured one, or it could not be read; one line."""


class _Myself(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    accountId: str = Field(min_length=1)  # noqa: N815 - Jira's names
    timeZone: str = Field(min_length=1)  # noqa: N815 - the site's default zone when the profile sets none


def check_profile_zone(http: httpx.Client, rest: str, config: JiraConfig) -> None:
    """Raise `JiraAccountRefused` unless the calling account's profile zone is `jql_time_zone`."""
    deadline = Deadline(ConnectorAttempt(attempt_number=1, deadline_remaining_milliseconds=COMPOSE_BUDGET_MS))
    response = send(http, "GET", f"{rest}/myself", deadline, "get_myself")
    if isinstance(response, Problem):
        raise JiraAccountRefused(_failed(response))
    if response.status_code != 200:
        problem = status_problem(response, _WHAT)
        if response.status_code == 401 and problem.reason == "authorization":
            raise JiraAccountRefused(f"{_WHAT}: HTTP 401 scope does not match: the API token lacks read:jira-user")
        raise JiraAccountRefused(_failed(problem))
    try:
        zone = _Myself.model_validate_json(response.content).timeZone
    except ValidationError:
        raise JiraAccountRefused(f"{_WHAT}: the answer carries no timeZone") from None
    if zone != config.jql_time_zone:
        raise JiraAccountRefused(
            f"provider.jql_time_zone is {config.jql_time_zone} but the Jira account's profile time zone is {zone} "
            f"(GET /rest/api/3/myself), in which JQL dates are read: set jql_time_zone: {zone} and register again")


def _failed(problem: Problem) -> str:
    then = "; the next run asks again" if problem.retry_class == "retryable" else ""
    return f"{_WHAT}: {problem.detail}{then}"
