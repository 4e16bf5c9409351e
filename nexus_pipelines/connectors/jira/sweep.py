"""The Jira side of the reconciliation sweep, over a composed `JiraConnector` (its client,
token and strict mapping; this module is part of the Jira package and reads its internals).

Listing: the enhanced search `GET /rest/api/3/search/jql` with
`jql=project = <id> [AND created >= "<minute>"] ORDER BY created ASC, id ASC` (creation
order never changes, so an edit moves no issue in it), `fields=updated,issuetype,created`
only, `maxResults=100`. Jira documents `nextPageToken` as opaque, and a token may hold an
offset: following it after an issue already listed was deleted would shift an unread one
onto the page already read. So the walk goes on from a fresh query bounded by the page's
last creation minute (inclusive, in the account's zone, which composition checked is
`jql_time_zone`: that minute's issues are read again) unless the whole page was created
within that one minute (then the token is followed). Sub-tasks (the issue's own
`issuetype.subtask` or `hierarchyLevel` -1, as a poll judges them) are counted, never
listed. Jira documents no conditional requests for search, so pages carry no validator.
Reading a gap: `GET /rest/api/3/issue/{id}` with the poll's fields, mapped exactly as a
poll maps it; 404, or an issue now in another project, means it is gone from this
registration.

Cursor: `jis2;<minute of the query's created bound, or ->;<nextPageToken, or ->`.
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
from nexus_pipelines.connectors.jira.cursor import earliest_meaning, jql_minute
from nexus_pipelines.connectors.jira.limits import status_problem
from nexus_pipelines.connectors.jira.payloads import Issue, IssueType
from nexus_pipelines.connectors.provider_http import (
    Deadline,
    Problem,
    fetch_failure,
    invalid_payload,
    item_of,
    read_body,
    send,
    served_at,
    unreadable_body,
)

PREFIX = "jis2;"
LIST_FIELDS = "updated,issuetype,created"
LIST_ORDER = "ORDER BY created ASC, id ASC"
NONE = "-"
_TOKEN = re.compile(r"^[\x21-\x7e]+$")
_CURSOR = re.compile(r"^jis2;(-|\d{4}-\d{2}-\d{2}T\d{2}:\d{2});([\x21-\x7e]+)$")
_RAW = ConfigDict(extra="ignore", frozen=True, strict=True)


class _ListedFields(BaseModel):
    model_config = _RAW
    updated: AwareDatetime
    issuetype: IssueType
    created: AwareDatetime | None = None  # asked for by the listing, not by a read of one issue


class _Listed(BaseModel):
    model_config = _RAW
    id: str = Field(pattern=r"^[0-9]{1,18}$")
    fields: _ListedFields


class _Listing(BaseModel):
    model_config = _RAW
    issues: list[_Listed] = Field(default_factory=list)
    nextPageToken: str | None = None  # noqa: N815 - Jira's names
    isLast: bool | None = None  # noqa: N815


class JiraSweep:
    def __init__(self, connector: JiraConnector) -> None:
        self._c = connector

    def list_identities(self, request: ListIdentities, attempt: ConnectorAttempt) -> ListIdentitiesResult:
        match = _CURSOR.match(request.cursor) if request.cursor is not None else None
        if request.cursor is not None and match is None:
            return FetchFailure(retry_class="terminal", reason="contract_violation", detail="not a Jira sweep cursor")
        minute, token = (match.group(1), match.group(2)) if match else (NONE, NONE)
        params = {"jql": self._jql(minute), "maxResults": request.page_size, "fields": LIST_FIELDS}
        if token != NONE:
            params["nextPageToken"] = token
        response = send(self._c._http, "GET", f"{self._c._rest}/search/jql", Deadline(attempt), "search_issues",
                        params=params)
        raw = read_body(response, "searching issues for the sweep", status_problem, _Listing.model_validate_json)
        if isinstance(raw, FetchFailure):
            return raw
        following = raw.nextPageToken
        if raw.isLast is not None and raw.isLast != (following is None):
            return invalid_payload("searching issues for the sweep: isLast contradicts nextPageToken")
        if following is not None and (not _TOKEN.match(following) or not raw.issues):
            return invalid_payload("searching issues for the sweep: nextPageToken is not a printable token after a "
                                   "page of issues")
        if any(i.fields.created is None for i in raw.issues):
            return invalid_payload("searching issues for the sweep: an issue came without the created field "
                                   "asked for")
        next_cursor = self._next(raw, minute, following) if following is not None else None
        if next_cursor is not None and len(next_cursor) > CURSOR_MAX_CHARS:
            return invalid_payload("searching issues for the sweep: nextPageToken is too long for a cursor token")
        cloud = self._c._config.cloud_id
        identities = tuple(IssueIdentity(external_ref=f"{KIND}:{cloud}:{i.id}", external_updated_at=i.fields.updated)
                           for i in raw.issues if not i.fields.issuetype.is_subtask)
        return IdentityPage(identities=identities, next_cursor=next_cursor, served_at=served_at(response),
                            excluded=len(raw.issues) - len(identities))

    def _jql(self, minute: str) -> str:
        bound = "" if minute == NONE else f' AND created >= "{minute.replace("T", " ")}"'
        return f"project = {self._c._config.project_id}{bound} {LIST_ORDER}"

    def _next(self, raw: _Listing, minute: str, following: str) -> str:
        """A fresh query from the page's last creation minute, or Jira's token when the whole
        page was created within that minute (a fresh query would answer the same page)."""
        first, last = raw.issues[0].fields.created, raw.issues[-1].fields.created
        if first < earliest_meaning(last, self._c._zone):  # the earliest instant of the last item's minute
            return f"{PREFIX}{jql_minute(last, self._c._zone).replace(' ', 'T')};{NONE}"
        return f"{PREFIX}{minute};{following}"

    def fetch_issue(self, request: FetchIssue, attempt: ConnectorAttempt) -> FetchIssueResult:
        issue_id = item_of(request.external_ref, KIND, self._c._config.cloud_id)
        if issue_id is None:
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
            return invalid_payload(f"reading issue {issue_id}: Jira answered with issue {item.id}")
        if item.fields.project.id != str(self._c._config.project_id):
            return FetchedIssue(issue=None)  # moved to another project: not this registration's any more
        if listed.fields.issuetype.is_subtask:
            return FetchedIssue(issue=None, excluded=True)
        try:
            return FetchedIssue(issue=self._c._map(item))
        except ValueError as exc:  # a refused field (ValidationError), body (AdfError) or state
            why = first_error(exc) if isinstance(exc, ValidationError) else str(exc)
            return invalid_payload(f"issue {issue_id}: {why}")


def sweep_source(connector: JiraConnector) -> JiraSweep:
    return JiraSweep(connector)
