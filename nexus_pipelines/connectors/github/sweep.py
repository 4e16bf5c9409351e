"""The GitHub side of the reconciliation sweep, over a composed `GitHubConnector` (its App
token, rate gate, client and strict mapping; this module is part of the GitHub package and
reads its internals).

Listing: `GET /repos/{owner}/{repo}/issues?state=all&sort=created&direction=asc&per_page=100&after=`
(creation order never changes, so an edit moves no issue in it), then the `Link rel="next"`
URLs exactly as given, inside the configured API. The empty `after=` asks for the cursor
form (GitHub's way to get an initial cursor), so every next link is a keyset `after=`
position: a deletion between two requests shifts no unread issue onto a page already read,
and no page is too deep (GitHub refuses page numbers 1,000 rows deep with 422). A GitHub
that answers page-number links anyway has them followed as given. Every item with a
`pull_request` key is a pull request: counted as excluded, never listed. Reading a gap:
`GET /repos/{owner}/{repo}/issues/{number}`, mapped exactly as a poll maps it; 404 and 410
mean the issue is gone (deleted or transferred), a pull request is excluded.

Conditional requests: every listing page's `ETag` is its validator. A request that names the
validator the last sweep kept for it sends `If-None-Match`; GitHub's 304 (which costs no
primary rate limit) is an `UnchangedPage`, and the sweep compares the page it kept.

Cursor: `ghs1;<path?query of the next page>`.
"""

from __future__ import annotations

from pydantic import TypeAdapter, ValidationError

from nexus_pipelines.connectors.core.sweep_values import (
    FetchedIssue,
    FetchIssue,
    FetchIssueResult,
    IdentityPage,
    IssueIdentity,
    ListIdentities,
    ListIdentitiesResult,
    UnchangedPage,
    VALIDATOR_MAX_CHARS,
)
from nexus_pipelines.connectors.core.values import CURSOR_MAX_CHARS, ConnectorAttempt, FetchFailure, first_error
from nexus_pipelines.connectors.github.adapter import _ETAG, KIND, GitHubConnector, _Issue, _Item
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

PREFIX = "ghs1;"
_ITEMS = TypeAdapter(list[dict])
_ONE = TypeAdapter(dict)


def _listed(content: bytes) -> list[tuple[_Item, bool]]:
    """A listing page's items, each with whether it is a pull request."""
    return [(_Item.model_validate(d), "pull_request" in d) for d in _ITEMS.validate_json(content)]


class GitHubSweep:
    def __init__(self, connector: GitHubConnector) -> None:
        self._c = connector

    def _repo(self, deadline: Deadline) -> str | Problem:
        """The repository's URL under the name GitHub reported when the token was minted."""
        problem = self._c.fresh_token(deadline)
        return problem if problem is not None else self._c._repo_path()

    def list_identities(self, request: ListIdentities, attempt: ConnectorAttempt) -> ListIdentitiesResult:
        if request.cursor is not None and not request.cursor.startswith(PREFIX + "/"):
            return FetchFailure(retry_class="terminal", reason="contract_violation", detail="not a GitHub sweep cursor")
        deadline = Deadline(attempt)
        if request.cursor is not None:
            url, params = f"{self._c._origin}{request.cursor.removeprefix(PREFIX)}", None
        else:
            repo = self._repo(deadline)
            if isinstance(repo, Problem):
                return fetch_failure(repo)
            url = f"{repo}/issues"
            params = {"state": "all", "sort": "created", "direction": "asc", "per_page": request.page_size,
                      "after": ""}
        headers = {"If-None-Match": request.validator} if request.validator else {}
        response = self._c.send("GET", url, deadline, "list_issues", params=params, headers=headers)
        if isinstance(response, Problem):
            return fetch_failure(response)
        if response.status_code == 304 and request.validator:
            return UnchangedPage(served_at=served_at(response))
        items = read_body(response, "listing issues for the sweep", self._c.classify, _listed)
        if isinstance(items, FetchFailure):
            return items
        repository = self._c._config.repository_id
        identities = tuple(IssueIdentity(external_ref=f"{KIND}:{repository}:{item.number}",
                                         external_updated_at=item.updated_at) for item, pull in items if not pull)
        token = None
        link = next_link(response)
        if link is not None:
            parsed = self._c._api_link(link)
            if isinstance(parsed, FetchFailure):
                return parsed
            token = PREFIX + parsed.raw_path.decode("ascii")
            if len(token) > CURSOR_MAX_CHARS:
                return invalid_payload("the next-page link is too long for a cursor token")
        etag = response.headers.get("ETag")
        return IdentityPage(identities=identities, next_cursor=token, excluded=len(items) - len(identities),
                            served_at=served_at(response), validator=etag if etag and _ETAG.fullmatch(etag)
                            and len(etag) <= VALIDATOR_MAX_CHARS else None)

    def fetch_issue(self, request: FetchIssue, attempt: ConnectorAttempt) -> FetchIssueResult:
        number = item_of(request.external_ref, KIND, str(self._c._config.repository_id))
        if number is None:
            return FetchFailure(retry_class="terminal", reason="unsupported_item",
                                detail=f"{request.external_ref} is not an issue of GitHub repository "
                                       f"{self._c._config.repository_id}")
        deadline = Deadline(attempt)
        repo = self._repo(deadline)
        if isinstance(repo, Problem):
            return fetch_failure(repo)
        response = self._c.send("GET", f"{repo}/issues/{number}", deadline, "get_issue")
        if isinstance(response, Problem):
            return fetch_failure(response)
        if response.status_code in (404, 410):
            return FetchedIssue(issue=None)
        if response.status_code != 200:
            return fetch_failure(self._c.classify(response, f"reading issue {number} for the sweep"))
        try:
            data = _ONE.validate_json(response.content)
            item = _Issue.model_validate(data)
        except ValidationError as exc:
            return unreadable_body(exc, f"reading issue {number}")
        if str(item.number) != number:
            return invalid_payload(f"reading issue {number}: GitHub answered with issue {item.number}")
        if "pull_request" in data:
            return FetchedIssue(issue=None, excluded=True)
        try:
            return FetchedIssue(issue=self._c._map(item))
        except ValidationError as exc:
            return invalid_payload(f"issue {number}: {first_error(exc)}")


def sweep_source(connector: GitHubConnector) -> GitHubSweep:
    return GitHubSweep(connector)
