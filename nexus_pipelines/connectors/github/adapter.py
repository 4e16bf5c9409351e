"""The GitHub Issues adapter: App credentials, transport, strict payloads, mapping, cursor
and reconciliation.

Listing: `GET /repos/{owner}/{repo}/issues?state=all&sort=updated&direction=asc&per_page=N`
with `since` (whole seconds), then the `Link rel="next"` URLs exactly as given, except
that on page-number pages a scan re-anchors at a fresh first page instead of following a
link that could skip an issue (`cursor.py`); one listing request per invocation. Every
item with a `pull_request` key is a pull request: skipped and counted as excluded, while
the cursor still moves past it. Identity:
`github:<repository id>:<number>`; the owner/name in the URL is the one GitHub reported
for the repository id when the token was minted (the token is narrowed to that id, so
a reused name can never be read under this repository's identity).

Close-back: a comment carrying the marker, then `PATCH state=closed,
state_reason=completed`. A write whose outcome the transport cannot prove is reconciled
inside the invocation: the issue's comments are listed (every page) for the exact
marker, and, for the close, the issue's state is read.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, SecretStr, TypeAdapter, ValidationError

from nexus_pipelines.connectors.core.registry import ComposeContext
from nexus_pipelines.connectors.core.values import (
    CloseExternalIssue,
    CloseExternalIssueResult,
    ConnectorAttempt,
    CloseFailure,
    ExternalIssue,
    ExternalIssuePage,
    FetchFailure,
    FetchIssuePage,
    FetchIssuePageResult,
    first_error,
)
from nexus_pipelines.connectors.github.app_auth import (
    SKEW_TOLERANCE_S,
    CredentialError,
    Installation,
    InstallationToken,
    ProviderClock,
    app_jwt,
    refusal,
)
from nexus_pipelines.connectors.github.closeback import CloseBack
from nexus_pipelines.connectors.github.config import GitHubConfig
from nexus_pipelines.connectors.github.cursor import GitHubCursor, format_time
from nexus_pipelines.connectors.github.limits import CONTENT_BUDGET, LIMIT_STATUSES, status_problem
from nexus_pipelines.connectors.provider_http import (
    Deadline,
    Problem,
    close_failure,
    decoded_cursor,
    fetch_failure,
    invalid_payload,
    issue_page,
    item_of,
    next_link,
    read_body,
    send,
    served_at,
)
from nexus_pipelines.connectors.provider_client import ClientOwner, gated_client
from nexus_pipelines.connectors.scan_cursor import holdable
from nexus_pipelines.integrations.http import HeaderTokenAuth, origin_of

KIND = "github"
API_VERSION = "2022-11-28"
COMPOSE_BUDGET_MS = 10_000
# an entity tag the cursor can carry: RFC 9110's `[W/]"etagc*"`, without the `;` that
# separates cursor fields; any other ETag is not kept (the next scan asks unconditionally)
_ETAG = re.compile(r'(W/)?"[\x21\x23-\x3a\x3c-\x7e]*"')


# -- strict raw payloads (only what is mapped; GitHub sends many more keys) -------------

_RAW = ConfigDict(extra="ignore", frozen=True, strict=True)


def _timestamp(value: object) -> datetime:
    """GitHub's timestamps are ISO 8601 text with a zone: not epoch seconds (a number, or a
    string of digits, which lax parsing would take for one), not a zone-less local time."""
    if not isinstance(value, str):
        raise ValueError("a timestamp is ISO 8601 text")
    moment = datetime.fromisoformat(value)
    if moment.utcoffset() is None:
        raise ValueError("a timestamp carries a zone")
    if not holdable(moment):  # it becomes the cursor's high-water mark
        raise ValueError("a timestamp is out of range")
    return moment


# the listing is validated strictly from the parsed JSON (a bool, a float or a digit string
# is no int), and the one type JSON cannot carry is read from its text here
Timestamp = Annotated[datetime, PlainValidator(_timestamp)]


class _User(BaseModel):
    model_config = _RAW
    id: int
    login: str


class _Label(BaseModel):
    model_config = _RAW
    name: str = Field(min_length=1)


class _Item(BaseModel):
    """What every listed item has, issue or pull request: enough to move the cursor."""

    model_config = _RAW
    number: int = Field(gt=0)
    updated_at: Timestamp


class _Issue(_Item):
    id: int
    title: str
    body: str | None
    state: Literal["open", "closed"]
    labels: list[_Label | str]
    user: _User | None  # a deleted account
    html_url: str


_ITEMS = TypeAdapter(list[dict])


def _invalid_listing(exc: ValidationError) -> FetchFailure:
    return invalid_payload(f"listing issues: {first_error(exc)}")


def _invalid_item(data: dict, exc: ValidationError) -> FetchFailure:
    """The failure for a listed item its model refused: named by its number when that much of it
    is readable (an issue's own fields), else the listing's (what every item needs)."""
    try:
        number = _Item.model_validate(data).number
    except ValidationError as unreadable:
        return _invalid_listing(unreadable)
    return _invalid_issue(number, exc)


def _invalid_issue(number: int, exc: ValidationError) -> FetchFailure:
    return invalid_payload(f"issue {number}: {first_error(exc)}")


def _first_page_params(since: datetime | None, page_size: int) -> dict:
    params = {"state": "all", "sort": "updated", "direction": "asc", "per_page": page_size}
    if since is not None:
        params["since"] = format_time(since)
    return params


class GitHubConnector(ClientOwner):
    """One composed GitHub registration: its pinned config, the App key and the current
    installation token, both in process memory only."""

    def __init__(self, config: GitHubConfig, private_key: SecretStr, context: ComposeContext, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._key = private_key
        self._origin = origin_of(config.api_url)
        self._prefix = httpx.URL(config.api_url).path.rstrip("/")
        self._clock = ProviderClock(clock)
        self._installation = Installation(config.app_id, config.installation_id, config.repository_id)
        self._token = InstallationToken(self._installation, self._clock)
        self._http = gated_client(
            context, config.api_url, f"installation {config.installation_id}", LIMIT_STATUSES, CONTENT_BUDGET,
            headers={"Accept": "application/vnd.github+json", "User-Agent": "nexus-pipelines",
                     "X-GitHub-Api-Version": API_VERSION},
        )

    def __repr__(self) -> str:
        return f"GitHubConnector(repository_id={self._config.repository_id})"

    # -- requests and credentials ---------------------------------------------------

    def _send(self, method: str, url: str, deadline: Deadline, endpoint: str, **kwargs) -> httpx.Response | Problem:
        """One request under the deadline, the installation's gate and a fresh installation token."""
        problem = self.fresh_token(deadline)
        if problem is not None:
            return problem
        response = self._request(method, url, deadline, endpoint,
                                 auth=HeaderTokenAuth("Authorization", self._token.value, scheme="Bearer"), **kwargs)
        if isinstance(response, httpx.Response) and response.status_code == 401:
            self._token.drop()  # revoked or expired: the next call mints, and fails closed if it must
        return response

    def _request(self, method: str, url: str, deadline: Deadline, endpoint: str, **kwargs) -> httpx.Response | Problem:
        response = send(self._http, method, url, deadline, endpoint, **kwargs)
        if isinstance(response, Problem):
            return response
        self._clock.observe(response)
        return response

    def fresh_token(self, deadline: Deadline) -> Problem | None:
        """None once the installation token is fresh (minted now if it was not), else why it is not."""
        return None if self._token.fresh() else self.mint(deadline)

    def mint(self, deadline: Deadline) -> Problem | None:
        """Exchange a fresh App JWT for an installation token narrowed to the repository. A 401
        whose `Date` shows GitHub's clock away from the one the JWT was signed on is a skewed
        local clock: signed again, once, on GitHub's clock."""
        signed_on = self._clock.offset
        response = self._exchange(deadline)
        if (isinstance(response, httpx.Response) and response.status_code == 401
                and abs(self._clock.offset - signed_on) > SKEW_TOLERANCE_S):
            response = self._exchange(deadline)
        if isinstance(response, Problem):
            return response
        what = f"minting the installation token of app {self._config.app_id}, installation " \
               f"{self._config.installation_id}"
        if response.status_code == 201:
            wrong = self._token.accept(response)
            return None if wrong is None else Problem("terminal", "authorization", f"{what}: {wrong}")
        problem = status_problem(response, what, self._clock)
        if response.status_code in (401, 403, 404, 422) and problem.reason != "throttled":
            # fail closed: a revoked key (401), a suspended (403) or removed (404) installation, or a
            # repository/permission the installation no longer grants (422)
            reason = "authentication" if response.status_code == 401 else "authorization"
            return Problem("terminal", reason, f"{what}: HTTP {response.status_code} {refusal(response)}; "
                                               "check the App key reference and the installation")
        return problem

    def _exchange(self, deadline: Deadline) -> httpx.Response | Problem:
        try:
            signed = app_jwt(self._config.app_id, self._key, self._clock.now())
        except CredentialError as exc:
            return Problem("terminal", "authentication", str(exc))
        return self._request("POST", f"{self._origin}{self._prefix}{self._installation.path}", deadline, "create_token",
                             json=self._installation.request_body(),
                             auth=HeaderTokenAuth("Authorization", lambda: signed, scheme="Bearer"))

    def _repo_path(self) -> str:
        return f"{self._origin}{self._prefix}/repos/{self._token.full_name}"

    def _api_link(self, link: str) -> httpx.URL | FetchFailure:
        """A next-page link GitHub gave, refused unless it is a URL inside the configured API."""
        try:
            parsed = httpx.URL(link)
        except httpx.InvalidURL:
            return invalid_payload("the next-page link is not a URL")
        if origin_of(parsed) != self._origin or not parsed.path.startswith(f"{self._prefix}/"):
            return invalid_payload("the next-page link points outside the configured API")
        return parsed

    # -- fetch ------------------------------------------------------------------------

    def fetch_page(self, request: FetchIssuePage, attempt: ConnectorAttempt) -> FetchIssuePageResult:
        cursor = decoded_cursor(GitHubCursor.decode, request.cursor)
        if isinstance(cursor, FetchFailure):
            return cursor
        deadline = Deadline(attempt)
        problem = self.fresh_token(deadline)  # the listing URL needs the repository's current name
        if problem is not None:
            return fetch_failure(problem)
        url, params, headers = self._listing(cursor, request.page_size)
        response = self._send("GET", url, deadline, "list_issues", params=params, headers=headers)
        if isinstance(response, Problem):
            return fetch_failure(response)
        if response.status_code == 304 and cursor.at_scan_start:
            return ExternalIssuePage(issues=(), next_cursor=cursor.unchanged().encode(), exhausted=True)
        if response.status_code == 422 and not cursor.at_scan_start:
            # GitHub refused the link it gave (a page number too deep, an expired or invalid `after=`):
            # go on in the cursor form, or restart, missing nothing (`GitHubCursor.refused`)
            in_cursor_form = self._first_page_path(urlsplit(cursor.next).path, request.page_size, after="")
            return ExternalIssuePage(issues=(), next_cursor=cursor.refused(in_cursor_form).encode(), exhausted=False)
        raw = read_body(response, "listing issues", self.classify, _ITEMS.validate_json)
        if isinstance(raw, FetchFailure):
            return raw
        return self._page(raw, response, cursor, request.page_size)

    def _listing(self, cursor: GitHubCursor, page_size: int) -> tuple[str, dict | None, dict]:
        if not cursor.at_scan_start:
            return f"{self._origin}{cursor.next}", None, {}
        headers = {"If-None-Match": cursor.etag} if cursor.etag else {}
        return f"{self._repo_path()}/issues", _first_page_params(cursor.since, page_size), headers

    def _first_page_path(self, link_path: str, page_size: int, **extra: str) -> Callable[[datetime | None], str]:
        """The path of the listing's first page from a `since`, for a scan that re-anchors on
        page-number pages (or, with `after=""`, goes on in the cursor form): the path GitHub's
        own next link names (under the immutable repository id on GitHub, so a rename mid-scan
        changes nothing), with a scan start's parameters."""
        base = httpx.URL(f"{self._origin}{link_path}")
        return lambda since: base.copy_with(params={**_first_page_params(since, page_size), **extra}).raw_path.decode(
            "ascii")

    def _page(self, raw: list[dict], response: httpx.Response, cursor: GitHubCursor,
              page_size: int) -> FetchIssuePageResult:
        items, issues = [], []
        for data in raw:
            try:
                # each item is validated once: a pull request as the `_Item` that moves the cursor
                item = _Item.model_validate(data) if "pull_request" in data else _Issue.model_validate(data)
            except ValidationError as exc:
                return _invalid_item(data, exc)
            items.append(item)
            if isinstance(item, _Issue):
                try:
                    issues.append(self._map(item))
                except ValidationError as exc:
                    return _invalid_issue(item.number, exc)
        excluded = len(items) - len(issues)
        link, link_path = next_link(response), ""
        if link is not None:
            parsed = self._api_link(link)
            if isinstance(parsed, FetchFailure):
                return parsed
            link, link_path = parsed.raw_path.decode("ascii"), parsed.path
        etag = response.headers.get("ETag")
        etag = etag if etag is not None and _ETAG.fullmatch(etag) else None
        after = cursor.after_page(items=[(str(item.number), item.updated_at) for item in items],
                                  served=served_at(response),
                                  etag=etag, next_link=link, first_page=self._first_page_path(link_path, page_size))
        return issue_page(issues, excluded, after, "the next-page link or ETag is too long for a cursor token")

    def _map(self, item: _Issue) -> ExternalIssue:
        user = item.user
        return ExternalIssue(
            connector_kind=KIND,
            external_ref=f"{KIND}:{self._config.repository_id}:{item.number}",
            title=item.title,
            description=item.body or "",
            source_labels=tuple(label if isinstance(label, str) else label.name for label in item.labels),
            reporter_ref=f"github-user:{user.id}" if user else "github-user:ghost",
            reporter_display_name=user.login if user else "ghost",
            external_state=item.state,
            external_updated_at=item.updated_at,
            display_url=item.html_url,
        )

    # -- close ------------------------------------------------------------------------

    def comment_and_close(self, command: CloseExternalIssue, attempt: ConnectorAttempt) -> CloseExternalIssueResult:
        number = item_of(command.external_ref, KIND, str(self._config.repository_id))
        if number is None:
            return CloseFailure(retry_class="terminal", reason="unsupported_item", write_disposition="not_written",
                                detail=f"{command.external_ref} is not an issue of GitHub repository "
                                       f"{self._config.repository_id}")
        deadline = Deadline(attempt)
        problem = self.fresh_token(deadline)  # the issue URL needs the repository's current name
        if problem is not None:
            return close_failure(problem)
        return CloseBack(self, command, f"{self._repo_path()}/issues/{number}", deadline).run()

    def send(self, method: str, url: str, deadline: Deadline, endpoint: str, **kwargs) -> httpx.Response | Problem:
        return self._send(method, url, deadline, endpoint, **kwargs)

    def classify(self, response: httpx.Response, what: str) -> Problem:
        return status_problem(response, what, self._clock)

    def compose_check(self) -> None:
        """The trusted composition path mints the first token; a revoked key or installation fails
        closed here with one line, a transient failure is left to the first invocation."""
        problem = self.mint(Deadline(ConnectorAttempt(attempt_number=1,
                                                      deadline_remaining_milliseconds=COMPOSE_BUDGET_MS)))
        if problem is not None and problem.retry_class == "terminal":
            self.close()
            raise GitHubCredentialsRefused(problem.detail)


class GitHubCredentialsRefused(RuntimeError):
    """GitHub refused the App's credentials at composition; one line naming app and installation."""


def build(config: GitHubConfig, secrets, context: ComposeContext, *,
          clock: Callable[[], float] = time.time) -> GitHubConnector:
    connector = GitHubConnector(config, secrets["private_key"], context, clock=clock)
    connector.compose_check()
    return connector
