"""The GitLab side of the reconciliation sweep, over a composed `GitLabConnector` (its client,
token and strict mapping; this module is part of the GitLab package and reads its internals).

Listing: `GET /projects/:id/issues?pagination=keyset&order_by=created_at&sort=asc&per_page=100`
(every state; `created_at` never changes, so keyset positions never move), then the
`Link rel="next"` exactly as given. A GitLab without keyset pages for issues ignores the
parameter or refuses it with 405 (then it is asked again without it): on offset pages a
deletion between two requests would shift an unread issue onto a page already read, so the
walk goes on from a fresh first page with `created_after` at the page's last `created_at`
(inclusive: that item and its ties are read again) unless the whole page shares one
`created_at` (then the page link is followed). Items of types the registration does not
ingest are counted as excluded. Reading a gap: `GET /projects/:id/issues/:iid`, mapped
exactly as a poll maps it; 404 means the issue is gone.

Cursor: `gls1;<path?query of the next request>`.
"""

from __future__ import annotations

from datetime import datetime

import httpx
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

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
from nexus_pipelines.connectors.gitlab.adapter import _ONE_ISSUE, KIND, GitLabConnector, _status_problem
from nexus_pipelines.connectors.gitlab.cursor import format_time
from nexus_pipelines.connectors.provider_http import (
    Deadline,
    Problem,
    fetch_failure,
    invalid_payload,
    item_of,
    next_link,
    read_body,
    served_at,
    unreadable_body,
)
from nexus_pipelines.connectors.scan_cursor import is_keyset_link

PREFIX = "gls1;"


class _Listed(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    iid: int = Field(gt=0)
    project_id: int
    created_at: datetime
    updated_at: datetime
    issue_type: str


_LISTED = TypeAdapter(list[_Listed])


class GitLabSweep:
    def __init__(self, connector: GitLabConnector) -> None:
        self._c = connector

    def _first_page(self, page_size: int, created_after: datetime | None = None) -> str:
        params = {"pagination": "keyset", "order_by": "created_at", "sort": "asc", "per_page": page_size}
        if created_after is not None:
            params["created_after"] = format_time(created_after)
        return httpx.URL(self._c._listing, params=params).raw_path.decode("ascii")

    def list_identities(self, request: ListIdentities, attempt: ConnectorAttempt) -> ListIdentitiesResult:
        if request.cursor is not None and not request.cursor.startswith(PREFIX + "/"):
            return FetchFailure(retry_class="terminal", reason="contract_violation", detail="not a GitLab sweep cursor")
        path = request.cursor.removeprefix(PREFIX) if request.cursor else self._first_page(request.page_size)
        deadline = Deadline(attempt)
        response = self._c._send("GET", f"{self._c._origin}{path}", deadline, "list_issues")
        if isinstance(response, httpx.Response) and response.status_code == 405 and "pagination=keyset" in path:
            # a GitLab without keyset pages for issues: ask for offset pages (re-anchored below)
            path = httpx.URL(path).copy_remove_param("pagination").raw_path.decode("ascii")
            response = self._c._send("GET", f"{self._c._origin}{path}", deadline, "list_issues")
        raw = read_body(response, "listing issues for the sweep", _status_problem, _LISTED.validate_json)
        if isinstance(raw, FetchFailure):
            return raw
        return self._page(raw, response, path, request.page_size)

    def _page(self, raw: list[_Listed], response: httpx.Response, path: str, page_size: int) -> ListIdentitiesResult:
        identities, excluded = [], 0
        for item in raw:
            if item.project_id != self._c._project:
                return invalid_payload(f"issue {item.iid} belongs to project {item.project_id}, not {self._c._project}")
            if item.issue_type not in self._c._config.issue_types:
                excluded += 1
                continue
            identities.append(IssueIdentity(external_ref=f"{KIND}:{self._c._project}:{item.iid}",
                                            external_updated_at=item.updated_at))
        link = next_link(response)
        following = None
        if link is not None:
            following = self._c._link_path(link)
            if isinstance(following, FetchFailure):
                return following
            if raw and not is_keyset_link(following, "cursor") and raw[0].created_at < raw[-1].created_at:
                following = httpx.URL(self._first_page(page_size, raw[-1].created_at))
                if "pagination=keyset" not in path:
                    following = following.copy_remove_param("pagination")
                following = following.raw_path.decode("ascii")
        token = PREFIX + following if following else None
        if token is not None and len(token) > CURSOR_MAX_CHARS:
            return invalid_payload("the next-page link is too long for a cursor token")
        return IdentityPage(identities=tuple(identities), next_cursor=token, excluded=excluded,
                            served_at=served_at(response))

    def fetch_issue(self, request: FetchIssue, attempt: ConnectorAttempt) -> FetchIssueResult:
        iid = item_of(request.external_ref, KIND, str(self._c._project))
        if iid is None:
            return FetchFailure(retry_class="terminal", reason="unsupported_item",
                                detail=f"{request.external_ref} is not an issue of GitLab project {self._c._project}")
        url = f"{self._c._prefix}/projects/{self._c._project}/issues/{iid}"
        response = self._c._send("GET", url, Deadline(attempt), "get_issue")
        if isinstance(response, Problem):
            return fetch_failure(response)
        if response.status_code == 404:
            return FetchedIssue(issue=None)
        if response.status_code != 200:
            return fetch_failure(_status_problem(response, f"reading issue {iid} for the sweep"))
        try:
            item = _ONE_ISSUE.validate_json(response.content)
        except ValidationError as exc:
            return unreadable_body(exc, f"reading issue {iid}")
        if item.project_id != self._c._project or str(item.iid) != iid:
            return invalid_payload(f"reading issue {iid}: GitLab answered with issue {item.iid} of project "
                                   f"{item.project_id}")
        if item.issue_type not in self._c._config.issue_types:
            return FetchedIssue(issue=None, excluded=True)
        try:
            return FetchedIssue(issue=self._c._map(item))
        except ValidationError as exc:
            return invalid_payload(f"issue {iid}: {first_error(exc)}")


def sweep_source(connector: GitLabConnector) -> GitLabSweep:
    return GitLabSweep(connector)
