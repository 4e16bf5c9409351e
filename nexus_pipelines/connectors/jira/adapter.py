"""The Jira Cloud adapter: transport, classification, strict payloads, mapping and cursor.

Listing: `GET /rest/api/3/search/jql` (the enhanced search) with
`jql=project = <id> [AND updated >= "<minute>"] ORDER BY updated ASC, id ASC`,
`maxResults` = the core's page bound and only the mapped `fields`; the next page is a fresh
query from the page's last update minute, or, inside one minute's tie run, the same query
with Jira's `nextPageToken` (`cursor.py`). One request per invocation. Identity:
`jira:<cloud id>:<issue id>`; the issue key is presentation only (it changes when an
issue moves). Sub-tasks (the issue's own `issuetype.subtask` or `hierarchyLevel` -1: a site
has several sub-task types, a team-managed project its own) are skipped and counted.
Close-back is in `closeback.py`. A 3xx is never followed. Composition refuses a
`jql_time_zone` other than the account's profile zone (`account.py`).
"""

from __future__ import annotations

import re
from zoneinfo import ZoneInfo

import httpx
from pydantic import SecretStr, ValidationError

from nexus_pipelines.connectors.core.registry import ComposeContext
from nexus_pipelines.connectors.core.values import (
    CloseExternalIssue,
    CloseExternalIssueResult,
    ConnectorAttempt,
    ExternalIssue,
    ExternalIssuePage,
    FetchFailure,
    FetchIssuePage,
    FetchIssuePageResult,
    first_error,
)
from nexus_pipelines.connectors.jira.account import JiraAccountRefused, check_profile_zone
from nexus_pipelines.connectors.jira.adf import to_text
from nexus_pipelines.connectors.jira.closeback import CloseBack
from nexus_pipelines.connectors.jira.config import JiraConfig
from nexus_pipelines.connectors.jira.cursor import JiraCursor, earliest_meaning, scan_jql
from nexus_pipelines.connectors.jira.limits import LIMIT_STATUSES, status_problem
from nexus_pipelines.connectors.jira.payloads import Issue, Search
from nexus_pipelines.connectors.provider_http import (
    Deadline,
    decoded_cursor,
    fetch_failure,
    invalid_payload,
    issue_page,
    read_body,
    send,
    served_at,
)
from nexus_pipelines.connectors.provider_client import JSON_HEADERS, ClientOwner, gated_client
from nexus_pipelines.integrations.http import HeaderTokenAuth
from nexus_pipelines.redaction import basic_credentials

KIND = "jira"
FIELDS = "summary,description,labels,reporter,status,updated,project,issuetype"
_TOKEN = re.compile(r"^[\x21-\x7e]+$")  # what a cursor token may hold


def _basic(email: str, token: SecretStr):
    pair = basic_credentials(email, token.get_secret_value())  # the encoded pair joins the redaction rule
    return lambda: pair


class JiraConnector(ClientOwner):
    """One composed Jira registration: its pinned config and process-local API token."""

    def __init__(self, config: JiraConfig, token: SecretStr, context: ComposeContext) -> None:
        self._config = config
        self._zone = ZoneInfo(config.jql_time_zone)
        self._rest = httpx.URL(config.api_url).path.rstrip("/") + config.rest_prefix
        # Jira limits per account: its email (not a secret) is the identity
        self._http = gated_client(context, config.api_url, f"account {config.email}", LIMIT_STATUSES,
                                  auth=HeaderTokenAuth("Authorization", _basic(config.email, token), scheme="Basic"),
                                  headers=JSON_HEADERS)

    def __repr__(self) -> str:
        return f"JiraConnector(cloud_id={self._config.cloud_id}, project_id={self._config.project_id})"

    # -- fetch ------------------------------------------------------------------------

    def fetch_page(self, request: FetchIssuePage, attempt: ConnectorAttempt) -> FetchIssuePageResult:
        cursor = decoded_cursor(JiraCursor.decode, request.cursor)
        if isinstance(cursor, FetchFailure):
            return cursor
        params = {"jql": scan_jql(self._config.project_id, cursor.bound, self._zone),
                  "maxResults": request.page_size, "fields": FIELDS}
        if cursor.next is not None:
            params["nextPageToken"] = cursor.next
        response = send(self._http, "GET", f"{self._rest}/search/jql", Deadline(attempt), "search_issues",
                        params=params)
        if not isinstance(response, httpx.Response):
            return fetch_failure(response)
        if response.status_code == 400 and cursor.token_expired(served_at(response)):
            # Jira refused a page token older than its 7-day life: the same scan again from its bound
            return ExternalIssuePage(issues=(), next_cursor=cursor.restart().encode(), exhausted=False)
        raw = read_body(response, "searching issues", status_problem, Search.model_validate_json)
        if isinstance(raw, FetchFailure):
            return raw
        return self._page(raw, response, cursor)

    def _page(self, raw: Search, response: httpx.Response, cursor: JiraCursor) -> FetchIssuePageResult:
        token = raw.nextPageToken
        if raw.isLast is not None and raw.isLast != (token is None):
            return invalid_payload("searching issues: isLast contradicts nextPageToken")
        if token is not None and not _TOKEN.match(token):
            return invalid_payload("searching issues: nextPageToken is not printable ASCII without spaces")
        floor = earliest_meaning(cursor.bound, self._zone)
        issues, excluded = [], 0
        for item in raw.issues:
            if item.fields.project.id != str(self._config.project_id):
                return invalid_payload(f"issue {item.id} belongs to project {item.fields.project.id}, "
                                       f"not {self._config.project_id}")
            if floor is not None and item.fields.updated < floor:
                return invalid_payload(f"issue {item.id} was updated before the query's bound: is "
                                       "provider.jql_time_zone the calling account's profile time zone?")
            if item.fields.issuetype.is_subtask:  # a sub-task belongs to its parent's ticket
                excluded += 1
                continue
            try:
                issues.append(self._map(item))
            except ValueError as exc:  # a refused field (ValidationError), body (AdfError) or state
                why = first_error(exc) if isinstance(exc, ValidationError) else str(exc)
                return invalid_payload(f"issue {item.id}: {why}")
        after = cursor.after_page(items=[(item.id, item.fields.updated) for item in raw.issues],
                                  served_at=served_at(response), next_token=token, zone=self._zone)
        return issue_page(issues, excluded, after, "searching issues: nextPageToken is too long for a cursor token")

    def _map(self, item: Issue) -> ExternalIssue:
        fields = item.fields
        state = fields.status.state
        if state is None:
            raise ValueError(f"status category {fields.status.statusCategory.key!r} is not one Jira documents")
        reporter = fields.reporter
        return ExternalIssue(
            connector_kind=KIND,
            external_ref=f"{KIND}:{self._config.cloud_id}:{item.id}",
            title=fields.summary,
            description=to_text(fields.description) if fields.description is not None else "",
            source_labels=tuple(fields.labels),
            reporter_ref=f"jira-user:{reporter.accountId}" if reporter else "jira-user:none",
            reporter_display_name=reporter.displayName if reporter else "",
            external_state=state,
            external_updated_at=fields.updated,
            display_url=f"{self._config.site_url.rstrip('/')}/browse/{item.key}",
        )

    def compose_check(self) -> None:
        """The account's profile zone must be `jql_time_zone` (JiraAccountRefused otherwise)."""
        try:
            check_profile_zone(self._http, self._rest, self._config)
        except JiraAccountRefused:
            self.close()
            raise

    # -- close ------------------------------------------------------------------------

    def comment_and_close(self, command: CloseExternalIssue, attempt: ConnectorAttempt) -> CloseExternalIssueResult:
        return CloseBack(self._http, self._rest, self._config, command, Deadline(attempt)).run()


def build(config: JiraConfig, secrets, context: ComposeContext) -> JiraConnector:
    connector = JiraConnector(config, secrets["token"], context)
    connector.compose_check()
    return connector
