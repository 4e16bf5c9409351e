"""The Jira side of the reconciliation sweep, over a composed `JiraConnector` (its client,
token and strict mapping; this module is part of the Jira package and reads its internals).

Listing: the enhanced search `GET /rest/api/3/search/jql` with
`jql=project = <id> ORDER BY id ASC` (no time bound, so neither the account's time zone nor
an edit moves an issue in it), `fields=updated,issuetype` only, `maxResults=100`, then
Jira's `nextPageToken`. Sub-tasks (the issue's own `issuetype.subtask` or `hierarchyLevel`
-1, as a poll judges them) are counted, never listed. Reading a gap: `GET /rest/api/3/issue/{id}` with the
poll's fields, mapped exactly as a poll maps it; 404, or an issue now in another project,
means it is gone from this registration.

Cursor: `jis1;<nextPageToken>`.
"""

from __future__ import annotations

import re

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from nexus_pipelines.connectors.core.sweep_values import (
    FetchedIssue,
    FetchIssue,
    FetchIssueResult,
    IdentityPage,
    IssueIdentity,
    ListIdentities,
    ListIdentitiesResult,
)
from nexus_pipelines.connectors.core.values import CURSOR_MAX_CHARS, ConnectorAttempt, FetchFailure, first_error
from nexus_pipelines.connectors.jira.adapter import FIELDS, KIND, JiraConnector
from nexus_pipelines.connectors.jira.limits import status_problem
from nexus_pipelines.connectors.jira.payloads import Issue, IssueType
from nexus_pipelines.connectors.provider_http import (
    Deadline,
    Problem,
    fetch_failure,
    send,
    served_at,
    unreadable_body,
)

PREFIX = "jis1;"
LIST_FIELDS = "updated,issuetype"
_TOKEN = re.compile(r"^[\x21-\x7e]+$")
_RAW = ConfigDict(extra="ignore", frozen=True, strict=True)


class _ListedFields(BaseModel):
    model_config = _RAW
    updated: AwareDatetime
    issuetype: IssueType


class _Listed(BaseModel):
    model_config = _RAW
    id: str = Field(pattern=r"^[0-9]{1,18}$")
    fields: _ListedFields


class _Listing(BaseModel):
    model_config = _RAW
    issues: list[_Listed] = Field(default_factory=list)
    nextPageToken: str | None = None  # noqa: N815 - Jira's names
    isLast: bool | None = None  # noqa: N815


def _invalid(detail: str) -> FetchFailure:
    return FetchFailure(retry_class="terminal", reason="invalid_payload", detail=detail[:300])



class JiraSweep:
    def __init__(self, connector: JiraConnector) -> None:
        self._c = connector


    def list_identities(self, request: ListIdentities, attempt: ConnectorAttempt) -> ListIdentitiesResult:
        if request.cursor is not None and not request.cursor.startswith(PREFIX):
            return FetchFailure(retry_class="terminal", reason="contract_violation", detail="not a Jira sweep cursor")
        params = {"jql": f"project = {self._c._config.project_id} ORDER BY id ASC",
                  "maxResults": request.page_size, "fields": LIST_FIELDS}
        if request.cursor is not None:
            params["nextPageToken"] = request.cursor.removeprefix(PREFIX)
        response = send(self._c._http, "GET", f"{self._c._rest}/search/jql", Deadline(attempt), "search_issues",
                        params=params)
        if isinstance(response, Problem):
            return fetch_failure(response)
        if response.status_code != 200:
            return fetch_failure(status_problem(response, "searching issues for the sweep"))
        try:
            raw = _Listing.model_validate_json(response.content)
        except ValidationError as exc:
            return unreadable_body(exc, "searching issues for the sweep")
        token = raw.nextPageToken
        if raw.isLast is not None and raw.isLast != (token is None):
            return _invalid("searching issues for the sweep: isLast contradicts nextPageToken")
        if token is not None and (not _TOKEN.match(token) or len(PREFIX + token) > CURSOR_MAX_CHARS):
            return _invalid("searching issues for the sweep: nextPageToken is not a printable token of at most "
                            f"{CURSOR_MAX_CHARS - len(PREFIX)} characters")
        cloud = self._c._config.cloud_id
        identities = tuple(IssueIdentity(external_ref=f"{KIND}:{cloud}:{i.id}", external_updated_at=i.fields.updated)
                           for i in raw.issues if not i.fields.issuetype.is_subtask)
        return IdentityPage(identities=identities, next_cursor=PREFIX + token if token else None,
                            served_at=served_at(response),
                            excluded=len(raw.issues) - len(identities))

    def fetch_issue(self, request: FetchIssue, attempt: ConnectorAttempt) -> FetchIssueResult:
        kind, _, rest = request.external_ref.partition(":")
        cloud, _, issue_id = rest.partition(":")
        if kind != KIND or cloud != self._c._config.cloud_id or not issue_id.isdigit():
            site = self._c._config.cloud_id
            return FetchFailure(retry_class="terminal", reason="unsupported_item",
                                detail=f"{request.external_ref} is not an issue of Jira site {site}")
        response = send(self._c._http, "GET", f"{self._c._rest}/issue/{issue_id}", Deadline(attempt), "get_issue",
                        params={"fields": FIELDS})
        if isinstance(response, Problem):
            return fetch_failure(response)
        if response.status_code == 404:
            return FetchedIssue(issue=None)
        if response.status_code != 200:
            return fetch_failure(status_problem(response, f"reading issue {issue_id} for the sweep"))
        try:
            item = Issue.model_validate_json(response.content)
            listed = _Listed.model_validate_json(response.content)
        except ValidationError as exc:
            return unreadable_body(exc, f"reading issue {issue_id}")
        if item.id != issue_id:
            return _invalid(f"reading issue {issue_id}: Jira answered with issue {item.id}")
        if item.fields.project.id != str(self._c._config.project_id):
            return FetchedIssue(issue=None)  # moved to another project: not this registration's any more
        if listed.fields.issuetype.is_subtask:
            return FetchedIssue(issue=None, excluded=True)
        try:
            return FetchedIssue(issue=self._c._map(item))
        except ValueError as exc:  # a refused field (ValidationError), body (AdfError) or state
            why = first_error(exc) if isinstance(exc, ValidationError) else str(exc)
            return _invalid(f"issue {issue_id}: {why}")


def sweep_source(connector: JiraConnector) -> JiraSweep:
    return JiraSweep(connector)
