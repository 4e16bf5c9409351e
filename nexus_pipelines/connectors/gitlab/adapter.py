"""The GitLab Issues adapter: transport, strict payloads, mapping, cursor and reconciliation.

Listing: `GET /projects/:id/issues?pagination=keyset&order_by=updated_at&sort=asc`
with `updated_after` (inclusive) and `per_page` = the core's page bound; one request
per invocation. Identity: `gitlab:<project id>:<iid>` (the project path is
presentation only). Close-back: a note carrying the marker, then `PUT` with
`state_event=close`. A write whose outcome the transport cannot prove (a timeout, a
reset or dropped connection, a 5xx, a body that does not parse) is reconciled before
the invocation returns: the issue's notes are searched for the exact marker (and, for
the close, the issue's state is read). A 3xx (a moved project) is never followed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, TypeAdapter, ValidationError

from nexus_pipelines.connectors.core.registry import ComposeContext
from nexus_pipelines.connectors.core.values import (
    CloseExternalIssue,
    CloseExternalIssueResult,
    CloseFailure,
    ConnectorAttempt,
    ConnectorReceipt,
    ExternalIssue,
    FetchFailure,
    FetchIssuePage,
    FetchIssuePageResult,
    first_error,
)
from nexus_pipelines.connectors.gitlab.config import GitLabConfig
from nexus_pipelines.connectors.gitlab.cursor import GitLabCursor, format_time
from nexus_pipelines.connectors.provider_http import (
    Deadline,
    MarkerLookup,
    Problem,
    after_close_write,
    after_comment_write,
    close_receipt,
    decoded_cursor,
    earlier_comment,
    invalid_payload,
    issue_page,
    item_of,
    next_link,
    other_status_problem,
    read_body,
    redirect_problem,
    send,
    served_at,
)
from nexus_pipelines.connectors.provider_client import JSON_HEADERS, ClientOwner, gated_client
from nexus_pipelines.connectors.rate_limits import wait_seconds
from nexus_pipelines.integrations.http import HeaderTokenAuth, origin_of

KIND = "gitlab"
MAX_NOTE_PAGES = 50  # a marker lookup reads at most 5,000 notes before it calls itself inconclusive


# -- strict raw payloads (only what is mapped; GitLab sends many more keys) -------------

_RAW = ConfigDict(extra="ignore", frozen=True, strict=True)


class _Author(BaseModel):
    model_config = _RAW
    id: int
    username: str
    name: str


class _Issue(BaseModel):
    model_config = _RAW
    id: int
    iid: int = Field(gt=0)
    project_id: int
    title: str
    description: str | None
    state: Literal["opened", "closed"]
    updated_at: datetime
    labels: list[str]
    author: _Author
    web_url: str
    # Newer GitLab lists other work item types here too (requirement, ticket, ...): an
    # item of a type the registration does not ingest is excluded, never a page failure.
    issue_type: str = Field(pattern=r"^[a-z][a-z_]{0,63}$")


class _Note(BaseModel):
    model_config = _RAW
    id: int
    body: str
    system: bool


_ISSUES = TypeAdapter(list[_Issue])
_NOTES = TypeAdapter(list[_Note])
_ONE_ISSUE = TypeAdapter(_Issue)


# -- classification (one table for fetch and close) ------------------------------------

LIMIT_STATUSES = frozenset({429})


def _status_problem(response: httpx.Response, what: str) -> Problem:
    moved = redirect_problem(response, what, " (the project moved? check provider.project_id)")
    if moved is not None:
        return moved
    status = response.status_code
    if status == 401:
        return Problem("terminal", "authentication", f"{what}: HTTP 401; the project access token is invalid, "
                                                      "expired or revoked")
    if status == 403:
        return Problem("terminal", "authorization", f"{what}: HTTP 403; the token lacks the api scope or the "
                                                     "Planner role")
    if status == 429:
        return Problem("retryable", "throttled", f"{what}: HTTP 429", wait_seconds(response, LIMIT_STATUSES))
    return other_status_problem(response, what)


def _first_page_params(since: datetime | None, page_size: int) -> dict:
    params = {"pagination": "keyset", "order_by": "updated_at", "sort": "asc", "per_page": page_size}
    if since is not None:
        params["updated_after"] = format_time(since)
    return params


class GitLabConnector(ClientOwner):
    """One composed GitLab registration: its pinned config and process-local token."""

    def __init__(self, config: GitLabConfig, token: SecretStr, context: ComposeContext) -> None:
        self._config = config
        self._project = config.project_id
        self._origin = origin_of(config.base_url)
        self._prefix = httpx.URL(config.base_url).path.rstrip("/") + "/api/v4"
        self._listing = f"{self._prefix}/projects/{self._project}/issues"
        # GitLab limits per user and token: the token's reference name is the identity (never its value)
        self._http = gated_client(context, config.base_url, f"token {config.token}", LIMIT_STATUSES,
                                  auth=HeaderTokenAuth("PRIVATE-TOKEN", token.get_secret_value), headers=JSON_HEADERS)

    def __repr__(self) -> str:
        return f"GitLabConnector(project_id={self._project})"

    # -- fetch ------------------------------------------------------------------------

    def fetch_page(self, request: FetchIssuePage, attempt: ConnectorAttempt) -> FetchIssuePageResult:
        cursor = decoded_cursor(GitLabCursor.decode, request.cursor)
        if isinstance(cursor, FetchFailure):
            return cursor
        deadline = Deadline(attempt)
        if cursor.next is not None:
            url = httpx.URL(f"{self._origin}{cursor.next}")
        else:
            url = httpx.URL(self._listing, params=_first_page_params(cursor.since, request.page_size))
        response = self._send("GET", url, deadline, "list_issues")
        if (isinstance(response, httpx.Response) and response.status_code == 405
                and url.params.get("pagination") == "keyset"):
            # a GitLab without keyset pages for this listing refuses them (405): ask for offset
            # pages, which the cursor re-anchors (one more call per first page on such a server)
            url = url.copy_remove_param("pagination")
            response = self._send("GET", url, deadline, "list_issues")
        raw = read_body(response, "listing issues", _status_problem, _ISSUES.validate_json)
        if isinstance(raw, FetchFailure):
            return raw
        return self._page(raw, response, cursor, request)

    def _page(self, raw: list[_Issue], response: httpx.Response, cursor: GitLabCursor,
              request: FetchIssuePage) -> FetchIssuePageResult:
        issues, excluded = [], 0
        for item in raw:
            if item.project_id != self._project:
                return invalid_payload(f"issue {item.iid} belongs to project {item.project_id}, not {self._project}")
            if item.issue_type not in self._config.issue_types:
                excluded += 1
                continue
            try:
                issues.append(self._map(item))
            except ValidationError as exc:
                return invalid_payload(f"issue {item.iid}: {first_error(exc)}")
        link = next_link(response)
        if link is not None:
            link = self._link_path(link)
            if isinstance(link, FetchFailure):
                return link
        base = httpx.URL(f"{self._origin}{self._listing}")
        after = cursor.after_page(
            items=[(str(i.iid), i.updated_at) for i in raw], served_at=served_at(response), next_link=link,
            # a re-anchor happens on offset pages only: the fresh first page asks for offset pages too
            first_page=lambda since: base.copy_with(params=_first_page_params(since, request.page_size))
            .copy_remove_param("pagination").raw_path.decode("ascii"),
        )
        return issue_page(issues, excluded, after, "the next-page link is too long for a cursor token")

    def _link_path(self, link: str) -> str | FetchFailure:
        """The path of a next-page link GitLab gave, refused unless it is on the configured origin."""
        parsed = httpx.URL(link)
        if origin_of(parsed) != self._origin:
            return invalid_payload("the next-page link points to another origin")
        return parsed.raw_path.decode("ascii")

    def _map(self, item: _Issue) -> ExternalIssue:
        return ExternalIssue(
            connector_kind=KIND,
            external_ref=f"{KIND}:{self._project}:{item.iid}",
            title=item.title,
            description=item.description or "",
            source_labels=tuple(item.labels),
            reporter_ref=f"gitlab-user:{item.author.id}",
            reporter_display_name=item.author.name,
            external_state="open" if item.state == "opened" else "closed",
            external_updated_at=item.updated_at,
            display_url=item.web_url,
        )

    # -- close ------------------------------------------------------------------------

    def comment_and_close(self, command: CloseExternalIssue, attempt: ConnectorAttempt) -> CloseExternalIssueResult:
        iid = item_of(command.external_ref, KIND, str(self._project))
        if iid is None:
            return CloseFailure(retry_class="terminal", reason="unsupported_item", write_disposition="not_written",
                                detail=f"{command.external_ref} is not an issue of GitLab project {self._project}")
        deadline = Deadline(attempt)
        base = f"{self._prefix}/projects/{self._project}/issues/{iid}"
        note_id, failure = earlier_comment(command, lambda: self._find_marker(base, command.marker, deadline))
        if failure is not None:
            return failure
        if note_id is None:
            note_id, failure = self._post_note(base, command, deadline)
            if failure is not None:
                return failure
        return self._close(base, command, note_id, deadline)

    def _send(self, method: str, url: str | httpx.URL, deadline: Deadline, endpoint: str,
              **kwargs) -> httpx.Response | Problem:
        return send(self._http, method, url, deadline, endpoint, **kwargs)

    def _post_note(self, base: str, command: CloseExternalIssue,
                   deadline: Deadline) -> tuple[str | None, CloseExternalIssueResult | None]:
        response = self._send("POST", f"{base}/notes", deadline, "create_note", json={"body": command.comment})
        problem = response if isinstance(response, Problem) else None
        if problem is None and response.status_code == 201:
            try:
                return str(TypeAdapter(_Note).validate_json(response.content).id), None
            except ValidationError:
                problem = Problem("retryable", "transport_protocol", "creating the note: the response body does "
                                   "not parse", maybe_written=True)
        if problem is None:
            problem = _status_problem(response, "creating the note")
        return after_comment_write(problem, lambda: self._find_marker(base, command.marker, deadline))

    def _close(self, base: str, command: CloseExternalIssue, note_id: str, deadline: Deadline) -> CloseExternalIssueResult:
        response = self._send("PUT", base, deadline, "close_issue", json={"state_event": "close"})
        problem = response if isinstance(response, Problem) else None
        if problem is None and response.status_code == 200:
            try:
                closed = _ONE_ISSUE.validate_json(response.content).state == "closed"
            except ValidationError:
                closed = None
            if closed:
                return self._receipt(command, note_id)
            problem = Problem("retryable", "transport_protocol", "closing the issue: the answer does not show it "
                               "closed", maybe_written=True)
        if problem is None:
            problem = _status_problem(response, "closing the issue")
        return after_close_write(problem, lambda: self._read_closed(base, deadline),
                                 lambda: self._receipt(command, note_id))

    def _read_closed(self, base: str, deadline: Deadline) -> bool | Problem:
        state = self._send("GET", base, deadline, "get_issue")
        if isinstance(state, Problem):
            return state
        if state.status_code != 200:
            return _status_problem(state, "reading the issue")
        try:
            return _ONE_ISSUE.validate_json(state.content).state == "closed"
        except ValidationError:
            return Problem("retryable", "transport_protocol", "reading the issue: the body does not parse")

    @staticmethod
    def _receipt(command: CloseExternalIssue, note_id: str) -> ConnectorReceipt:
        return close_receipt(command, f"note:{note_id}")

    def _find_marker(self, base: str, marker: str, deadline: Deadline) -> MarkerLookup:
        """Search the issue's notes for the exact marker: found, absent (problem None), or inconclusive."""
        page = "1"
        for _ in range(MAX_NOTE_PAGES):
            response = self._send("GET", f"{base}/notes", deadline, "list_notes",
                                  params={"sort": "asc", "order_by": "created_at", "per_page": 100, "page": page})
            if isinstance(response, Problem):
                return MarkerLookup(problem=response)
            if response.status_code != 200:
                return MarkerLookup(problem=_status_problem(response, "reading notes"))
            try:
                notes = _NOTES.validate_json(response.content)
            except ValidationError:
                return MarkerLookup(problem=Problem("retryable", "transport_protocol", "reading notes: the body does "
                                                "not parse"))
            for note in notes:
                if not note.system and marker in note.body:
                    return MarkerLookup(found=str(note.id))
            page = response.headers.get("x-next-page", "")
            if not page:
                return MarkerLookup()
        return MarkerLookup(problem=Problem("retryable", "provider_5xx", f"reading notes: more than {MAX_NOTE_PAGES} "
                                        "pages"))


def build(config: GitLabConfig, secrets, context: ComposeContext) -> GitLabConnector:
    return GitLabConnector(config, secrets["token"], context)
