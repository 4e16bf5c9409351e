"""A stateful GitHub simulator: the parts of the REST API (2022-11-28) the GitHub connector uses.

Modelled on GitHub's documentation, and at least as strict for what the connector sends:

* GitHub Apps: `POST /app/installations/{id}/access_tokens` takes only an RS256 App JWT
  verified against the App's registered public keys (`iat` not in the future, `exp`
  in the future and at most ten minutes ahead, `iss` the App id), answers 401 with
  GitHub's words otherwise, 404 for an unknown installation, 403 for a suspended one,
  422 for a repository or permission the installation does not grant; tokens (`ghs_`)
  last an hour and cover only the repositories and permissions asked for.
* Requests need a `User-Agent`; an unknown `X-GitHub-Api-Version` is a 400; a bad,
  expired or revoked token is 401 "Bad credentials"; a repository the token does not
  cover is 404; a missing permission is 403 "Resource not accessible by integration".
* Issues: `GET /repos/{owner}/{repo}/issues` (and `/repositories/{id}/issues`, where
  GitHub's own links point) with `state` (default open), `sort` (default created),
  `direction` (default desc), `since` (updated after), `per_page` (default 30, at most
  100); pull requests come back in the list with a `pull_request` key. Pages: by
  default an opaque `after=` keyset over (sort value, id) given in `Link rel="next"`
  (as GitHub pages large listings); with `GitHubState.issue_paging = "page"` the
  `Link` header carries page numbers only (`page=N` with `rel="next"`, `"last"`,
  `"first"`, `"prev"`, the form GitHub's pagination guide shows for this listing), so
  an update or deletion between two requests shifts later rows back one position. A
  page number deep in a listing (`page` without `after`, 1,000 rows or more in) is
  refused with 422 as GitHub does, and an empty `after=` asks for the first page in the
  cursor form (its links carry `after=` even in page mode, as GitHub gives an initial
  cursor to a request with an empty `after`); every listing has an ETag and `If-None-Match` gets
  a 304 that costs no rate limit (`charged_calls` counts the answers that did cost it).
  Timestamps are whole seconds.
* Comments (ascending id, page-numbered `Link` pages) and their creation (a comment
  touches the issue's `updated_at`), `PATCH` of an issue's `state`/`state_reason`.
* A renamed repository: its old `/repos/{owner}/{name}` answers 301 to GET and 307 to
  writes, with a `Location` under `/repositories/{id}`.
* Rate limits with GitHub's headers: a primary budget per installation (403 with
  `x-ratelimit-remaining: 0` until `x-ratelimit-reset`; `x-ratelimit-*` on every
  answer), a secondary limit on content creation (GitHub's 80 content-creating requests
  a minute and 500 an hour, on by default on the simulator's own clock, so a world on a
  frozen clock that creates more than 80 comments must move its clock; `secondary = None`
  turns it off; of the routes here only a comment creates content): the
  creation past `creations` in any 60 s or past `hourly_creations` in any hour (per
  installation, whichever client or process sends it) blocks the installation's content
  creation for `retry_after` seconds (a minute when GitHub sends only the message), and
  every creation meanwhile is refused again (403 with the remaining `retry-after`, or only
  the message). `limited_calls` counts requests that arrived while a limit was already in
  force (the primary budget spent, a block).
* The fault rows every simulator shares (`FaultQueue`, per operation name).
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import itertools
import json
import re
import secrets
import threading
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import jwt

from nexus_pipelines.local.simulators.gitlab import SimClock
from nexus_pipelines.local.simulators.http import FaultQueue, Simulator, SimRequest, SimResponse, SimulatorState
from nexus_pipelines.local.simulators.http import build_app, find_route, parse_time, positive

API_VERSIONS = ("2022-11-28", "2026-03-10")
DOCS = "https://docs.github.com/rest"
DEEP_PAGE_ROWS = 1000
TOKEN_LIFETIME_S = 3600
JWT_MAX_AHEAD_S = 600
COMMENT_MAX_CHARS = 65536
LEVELS = ("read", "write", "admin")
DEEP_PAGE_MESSAGE = ("Pagination with the page parameter is not supported for large datasets, please use cursor "
                     "based pagination (after/before)")
SECONDARY_MESSAGE = ("You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If "
                     "you reach out to GitHub Support for help, please include the request ID 0000:0000:0000.")

_REPO = r"(?:/repos/(?P<owner>[^/]+)/(?P<name>[^/]+)|/repositories/(?P<rid>\d+))"
_ROUTES = (
    (re.compile(r"^/app/installations/(?P<inst>\d+)/access_tokens$"), {"POST": "create_token"}),
    (re.compile(_REPO + r"/issues$"), {"GET": "list_issues"}),
    (re.compile(_REPO + r"/issues/(?P<number>\d+)$"), {"GET": "get_issue", "PATCH": "update_issue"}),
    (re.compile(_REPO + r"/issues/(?P<number>\d+)/comments$"), {"GET": "list_comments", "POST": "create_comment"}),
)
PERMISSION_OF = {"list_issues": ("issues", "read"), "get_issue": ("issues", "read"),
                 "list_comments": ("issues", "read"), "update_issue": ("issues", "write"),
                 "create_comment": ("issues", "write")}


def iso_s(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class User:
    id: int
    login: str
    type: str = "User"

    def payload(self) -> dict[str, Any]:
        return {"login": self.login, "id": self.id, "node_id": f"U_{self.id}", "type": self.type,
                "site_admin": False, "url": f"https://api.github.com/users/{self.login}"}


@dataclass
class Comment:
    id: int
    body: str
    user: User
    created_at: datetime


@dataclass
class Issue:
    id: int
    number: int
    title: str
    body: str | None
    user: User | None
    labels: list[str]
    created_at: datetime
    updated_at: datetime
    state: str = "open"
    state_reason: str | None = None
    closed_at: datetime | None = None
    is_pull_request: bool = False
    comments: list[Comment] = field(default_factory=list)


@dataclass
class Repository:
    id: int
    owner: str
    name: str
    issues: dict[int, Issue] = field(default_factory=dict)
    former_names: set[str] = field(default_factory=set)

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


@dataclass
class App:
    id: int
    slug: str
    public_keys: list[str]  # PEM; removing one revokes it


@dataclass
class Installation:
    id: int
    app_id: int
    repository_ids: list[int]
    permissions: dict[str, str]
    suspended: bool = False


@dataclass
class Token:
    value: str
    installation_id: int
    repository_ids: list[int]
    permissions: dict[str, str]
    expires_at: datetime
    revoked: bool = False


@dataclass
class PrimaryLimit:
    limit: int  # requests per window per installation
    window_s: int = 3600


@dataclass
class SecondaryLimit:
    creations: int = 80  # content-creating requests per minute
    retry_after: int | None = 60  # None: GitHub sends only the message
    hourly_creations: int = 500  # content-creating requests per hour


class GitHubState(SimulatorState):
    """Everything the simulator knows; thread-safe (the served app runs handlers on a pool)."""

    def __init__(self, clock: SimClock | None = None) -> None:
        self.clock = clock or SimClock()
        self.apps: dict[int, App] = {}
        self.installations: dict[int, Installation] = {}
        self.repositories: dict[int, Repository] = {}
        self.tokens: dict[str, Token] = {}
        self.faults = FaultQueue()
        self.issue_paging = "after"  # "after": keyset links; "page": page-number links only
        self.primary: PrimaryLimit | None = None
        self.secondary: SecondaryLimit | None = SecondaryLimit()  # GitHub documents it: always on (None: off)
        self.calls: Counter[str] = Counter()
        self.limited_calls = 0
        self.charged_calls = 0  # answers that counted against the primary limit (a 304 does not)
        self._used: Counter[tuple[int, int]] = Counter()
        self._created: dict[int, list[datetime]] = {}  # creation times of the last hour, per installation
        self._blocked_until: dict[int, datetime] = {}
        self._ids = itertools.count(1000)
        self._lock = threading.RLock()

    # -- setup ----------------------------------------------------------------------

    def add_app(self, app_id: int, public_key_pem: str, slug: str = "nexus-intake") -> App:
        with self._lock:
            return self.apps.setdefault(app_id, App(app_id, slug, [public_key_pem]))

    def install(self, installation_id: int, app_id: int, repository_ids: list[int],
                permissions: dict[str, str] | None = None) -> Installation:
        with self._lock:
            installation = Installation(installation_id, app_id, list(repository_ids),
                                        dict(permissions or {"issues": "write", "metadata": "read"}))
            self.installations[installation_id] = installation
            return installation

    def add_repository(self, repository_id: int, owner: str, name: str) -> Repository:
        with self._lock:
            return self.repositories.setdefault(repository_id, Repository(repository_id, owner, name))

    def rename(self, repository_id: int, owner: str, name: str) -> None:
        with self._lock:
            repo = self.repositories[repository_id]
            repo.former_names.add(repo.full_name.lower())
            repo.owner, repo.name = owner, name

    def revoke_tokens(self, installation_id: int) -> None:
        with self._lock:
            for token in self.tokens.values():
                if token.installation_id == installation_id:
                    token.revoked = True

    def add_issue(self, repository_id: int, *, title: str, body: str | None = "", labels: list[str] | None = None,
                  updated_at: datetime | None = None, pull_request: bool = False, user: User | None = None) -> Issue:
        with self._lock:
            repo = self.repositories[repository_id]
            number = max(repo.issues, default=0) + 1
            now = updated_at or self.clock.now()
            issue = Issue(next(self._ids), number, title, body, user or User(7, "rita-reporter"), list(labels or []),
                          now, now, is_pull_request=pull_request)
            repo.issues[number] = issue
            return issue

    def update_issue(self, repository_id: int, number: int, *, updated_at: datetime | None = None,
                     **changes: Any) -> Issue:
        with self._lock:
            issue = self.repositories[repository_id].issues[number]
            for name, value in changes.items():
                setattr(issue, name, value)
            issue.updated_at = updated_at or self.clock.now()
            return issue

    def issue(self, repository_id: int, number: int) -> Issue:
        with self._lock:
            return self.repositories[repository_id].issues[number]

    def add_comment(self, repository_id: int, number: int, body: str, user: User | None = None) -> Comment:
        with self._lock:
            comment = Comment(next(self._ids), body, user or User(8, "someone"), self.clock.now())
            self.repositories[repository_id].issues[number].comments.append(comment)
            return comment

    # -- persistence (the local stack keeps its simulator's data across restarts) ------

    def _records(self) -> dict[str, Any]:
        return {"repositories": [{"id": r.id, "owner": r.owner, "name": r.name, "former_names": sorted(r.former_names),
                                  "issues": [asdict(i) for i in r.issues.values()]}
                                 for r in self.repositories.values()]}

    def _restore(self, data: dict[str, Any]) -> None:
        for r in data["repositories"]:
            repo = self.add_repository(r["id"], r["owner"], r["name"])
            repo.former_names = set(r["former_names"])
            for raw in r["issues"]:
                issue = _issue_from_record(raw)
                repo.issues[issue.number] = issue

    # -- request accounting ----------------------------------------------------------

    def window(self) -> tuple[int, int]:
        """(window number, reset epoch) of the primary limit now."""
        assert self.primary is not None
        now = int(self.clock.now().timestamp())
        number = now // self.primary.window_s
        return number, (number + 1) * self.primary.window_s

    def rate_headers(self, installation_id: int, *, spend: bool) -> tuple[dict[str, str], bool]:
        """GitHub's `x-ratelimit-*` headers and whether this request is over the primary budget."""
        if self.primary is None:
            self.charged_calls += spend
            return {}, False
        number, reset = self.window()
        key = (installation_id, number)
        over = self._used[key] >= self.primary.limit
        if over:
            self.limited_calls += 1
        elif spend:
            self._used[key] += 1
            self.charged_calls += 1
        used = self._used[key]
        return {"x-ratelimit-limit": str(self.primary.limit), "x-ratelimit-remaining": str(self.primary.limit - used),
                "x-ratelimit-used": str(used), "x-ratelimit-reset": str(reset), "x-ratelimit-resource": "core"}, over

    def secondary_refusal(self, installation_id: int) -> dict[str, str] | None:
        """For a content-creating request: None when it may create, else its refusal's extra headers."""
        if self.secondary is None:
            return None
        with self._lock:
            now = self.clock.now()
            wait = self.secondary.retry_after
            until = self._blocked_until.get(installation_id)
            if until is not None and now < until:
                self.limited_calls += 1
                return {"retry-after": str(max(int((until - now).total_seconds()), 1))} if wait else {}
            recent = [t for t in self._created.get(installation_id, []) if t > now - timedelta(hours=1)]
            last_minute = [t for t in recent if t > now - timedelta(minutes=1)]
            if len(last_minute) >= self.secondary.creations or len(recent) >= self.secondary.hourly_creations:
                self._blocked_until[installation_id] = now + timedelta(seconds=wait or 60)
                return {"retry-after": str(wait)} if wait else {}
            self._created[installation_id] = [*recent, now]
            return None


def _issue_from_record(raw: dict[str, Any]) -> Issue:
    def when(value: str | None) -> datetime | None:
        return datetime.fromisoformat(value) if value else None

    comments = [Comment(c["id"], c["body"], User(**c["user"]), when(c["created_at"])) for c in raw["comments"]]
    user = User(**raw["user"]) if raw["user"] else None
    return Issue(raw["id"], raw["number"], raw["title"], raw["body"], user, raw["labels"],
                 when(raw["created_at"]), when(raw["updated_at"]), raw["state"], raw["state_reason"],
                 when(raw["closed_at"]), raw["is_pull_request"], comments)


# -- payloads --------------------------------------------------------------------------


def issue_payload(issue: Issue, repo: Repository, api: str) -> dict[str, Any]:
    web = api.replace("//api.", "//", 1) if "//api." in api else api
    base = f"{api}/repos/{repo.full_name}/issues/{issue.number}"
    payload = {
        "url": base, "repository_url": f"{api}/repos/{repo.full_name}", "labels_url": f"{base}/labels{{/name}}",
        "comments_url": f"{base}/comments", "events_url": f"{base}/events",
        "html_url": f"{web}/{repo.full_name}/{'pull' if issue.is_pull_request else 'issues'}/{issue.number}",
        "id": issue.id, "node_id": f"I_{issue.id}", "number": issue.number, "title": issue.title,
        "user": issue.user.payload() if issue.user else None,  # a deleted account
        "labels": [{"id": abs(hash(n)) % 10**9, "node_id": f"LA_{n}", "url": f"{api}/repos/{repo.full_name}/labels/{n}",
                    "name": n, "color": "d73a4a", "default": False, "description": None} for n in issue.labels],
        "state": issue.state, "state_reason": issue.state_reason, "locked": False, "assignee": None, "assignees": [],
        "milestone": None, "comments": len(issue.comments), "created_at": iso_s(issue.created_at),
        "updated_at": iso_s(issue.updated_at), "closed_at": iso_s(issue.closed_at), "author_association": "NONE",
        "active_lock_reason": None, "body": issue.body, "closed_by": None, "timeline_url": f"{base}/timeline",
        "performed_via_github_app": None,
    }
    if issue.is_pull_request:
        pulls = f"{api}/repos/{repo.full_name}/pulls/{issue.number}"
        payload["pull_request"] = {"url": pulls, "html_url": payload["html_url"], "diff_url": f"{pulls}.diff",
                                   "patch_url": f"{pulls}.patch", "merged_at": None}
    return payload


def comment_payload(comment: Comment, issue: Issue, repo: Repository, api: str) -> dict[str, Any]:
    return {"id": comment.id, "node_id": f"IC_{comment.id}",
            "url": f"{api}/repos/{repo.full_name}/issues/comments/{comment.id}",
            "html_url": f"{api}/{repo.full_name}/issues/{issue.number}#issuecomment-{comment.id}",
            "issue_url": f"{api}/repos/{repo.full_name}/issues/{issue.number}", "body": comment.body,
            "user": comment.user.payload(), "created_at": iso_s(comment.created_at),
            "updated_at": iso_s(comment.created_at), "author_association": "NONE", "performed_via_github_app": None}


def error(status: int, message: str, headers: dict[str, str] | None = None, **extra: Any) -> SimResponse:
    return SimResponse.json(status, {"message": message, "documentation_url": DOCS, **extra}, headers)


def invalid(field_name: str, resource: str = "Issue") -> SimResponse:
    return error(422, "Validation Failed", errors=[{"resource": resource, "field": field_name, "code": "invalid"}])


def _encode_position(position: tuple[int, int]) -> str:
    return base64.urlsafe_b64encode(f"cursor:v2:{position[0]}:{position[1]}".encode()).decode()


def _decode_position(value: str) -> tuple[int, int] | None:
    try:
        prefix, _, rest = base64.urlsafe_b64decode(value.encode()).decode().partition("cursor:v2:")
        key, _, ident = rest.partition(":")
        return (int(key), int(ident)) if prefix == "" else None
    except (ValueError, UnicodeDecodeError):
        return None


def _page_links(base: str, params: dict[str, Any], page: int, pages: int) -> dict[str, str]:
    """GitHub's page-number `Link` header (none when everything fits on one page)."""
    def link(number: int, rel: str) -> str:
        return f'<{base}?{urlencode({**params, "page": number})}>; rel="{rel}"'

    links = []
    if page > 1:
        links.append(link(page - 1, "prev"))
    if page < pages:
        links += [link(page + 1, "next"), link(pages, "last")]
    if page > 1:
        links.append(link(1, "first"))
    return {"Link": ", ".join(links)} if links else {}


def _position(issue: Issue, sort: str) -> tuple[int, int]:
    if sort == "comments":
        return len(issue.comments), issue.id
    moment = issue.updated_at if sort == "updated" else issue.created_at
    return int(moment.timestamp() * 1000), issue.id


def _allows(granted: str | None, needed: str) -> bool:
    return granted in LEVELS and LEVELS.index(granted) >= LEVELS.index(needed)


def _bearer(request: SimRequest) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() in ("bearer", "token") and value.strip() else None


class GitHubSimulator(Simulator):
    """The GitHub API over a `GitHubState`: `route` names the operation, `_answer` serves it."""

    fault_body = {"message": "Server Error", "documentation_url": DOCS}

    @staticmethod
    def route(request: SimRequest) -> tuple[str, dict[str, str] | None]:
        operation, match = find_route(_ROUTES, request)
        return operation, None if match is None else match.groupdict()

    def _answer(self, request: SimRequest, operation: str, match: dict[str, str] | None) -> SimResponse:
        if match is None or operation == "method_not_allowed":
            return error(404, "Not Found")
        if not request.headers.get("user-agent"):
            return error(403, "Request forbidden by administrative rules. Please make sure your request has a "
                              "User-Agent header (https://docs.github.com/en/rest/overview/resources-in-the-rest-api"
                              "#user-agent-required). Check https://developer.github.com for other possible causes.")
        version = request.headers.get("x-github-api-version")
        if version is not None and version not in API_VERSIONS:
            return error(400, f"API version '{version}' is not supported.")
        with self.state._lock:
            if operation == "create_token":
                return TokenDesk(self.state).create(request, int(match["inst"]))
            return self._repository_call(request, operation, match)

    def _repository_call(self, request: SimRequest, operation: str, match: dict[str, str]) -> SimResponse:
        state = self.state
        raw = _bearer(request)
        token = state.tokens.get(raw or "")
        if raw is None:
            return error(401, "Requires authentication")
        if token is None or token.revoked or token.expires_at <= state.clock.now():
            return error(401, "Bad credentials")
        repo, moved = self._repository(match)
        if repo is None or repo.id not in token.repository_ids:
            return error(404, "Not Found")
        if moved:
            suffix = request.path.split("/", 4)[4]
            location = f"{request.base_url}/repositories/{repo.id}/{suffix}"
            query = urlencode({k: v[-1] for k, v in request.query.items()})
            status = 301 if request.method == "GET" else 307
            return error(status, "Moved Permanently" if status == 301 else "Temporary Redirect",
                         {"Location": location + (f"?{query}" if query else "")}, url=location)
        resource, level = PERMISSION_OF[operation]
        if not _allows(token.permissions.get(resource), level):
            return error(403, "Resource not accessible by integration",
                         {"x-accepted-github-permissions": f"{resource}={level}"})
        return self._limited(request, operation, repo, match, token)

    def _repository(self, match: dict[str, str]) -> tuple[Repository | None, bool]:
        if match.get("rid"):
            return self.state.repositories.get(int(match["rid"])), False
        wanted = f"{match['owner']}/{match['name']}".lower()
        for repo in self.state.repositories.values():
            if repo.full_name.lower() == wanted:
                return repo, False
        for repo in self.state.repositories.values():
            if wanted in repo.former_names:
                return repo, True
        return None, False

    def _limited(self, request: SimRequest, operation: str, repo: Repository, match: dict[str, str],
                 token: Token) -> SimResponse:
        state = self.state
        headers, over = state.rate_headers(token.installation_id, spend=False)
        if over:
            return error(403, f"API rate limit exceeded for installation ID {token.installation_id}.", headers)
        retry = state.secondary_refusal(token.installation_id) if operation == "create_comment" else None
        if retry is not None:
            return error(403, SECONDARY_MESSAGE, {**headers, **retry})
        answer = Endpoints(state, repo, request).answer(operation, match)
        if answer.status != 304:  # a conditional request answered 304 costs no rate limit
            headers, _ = state.rate_headers(token.installation_id, spend=True)
        answer.headers.update(headers)
        return answer


class TokenDesk:
    """`POST /app/installations/{id}/access_tokens`: App JWT in, installation token out."""

    def __init__(self, state: GitHubState) -> None:
        self.state = state

    def create(self, request: SimRequest, installation_id: int) -> SimResponse:
        app, refused = self._app(request)
        if refused is not None:
            return refused
        installation = self.state.installations.get(installation_id)
        if installation is None or installation.app_id != app.id:
            return error(404, "Not Found")
        if installation.suspended:
            return error(403, "This installation has been suspended")
        try:
            body = json.loads(request.body) if request.body else {}
        except ValueError:
            return error(400, "Problems parsing JSON")
        if not isinstance(body, dict):
            return error(400, "Body should be a JSON object")
        return self._issue(installation, body)

    def _app(self, request: SimRequest) -> tuple[App | None, SimResponse | None]:
        undecodable = error(401, "A JSON web token could not be decoded")
        raw = _bearer(request)
        try:
            header = jwt.get_unverified_header(raw or "")
            claims = jwt.decode(raw or "", options={"verify_signature": False})
        except jwt.PyJWTError:
            return None, undecodable
        app = self.state.apps.get(int(claims["iss"])) if str(claims.get("iss", "")).isdigit() else None
        if header.get("alg") != "RS256" or app is None:
            return None, undecodable
        for key in app.public_keys:
            try:
                jwt.decode(raw, key, algorithms=["RS256"], options={"verify_exp": False, "verify_iat": False,
                                                                   "verify_nbf": False})
                break
            except jwt.PyJWTError:
                continue
        else:
            return None, undecodable
        now = self.state.clock.now().timestamp()
        iat, exp = claims.get("iat"), claims.get("exp")
        if not isinstance(iat, int) or iat > now:
            return None, error(401, "'Issued at' claim ('iat') must be an Integer representing the time that the "
                                    "assertion was issued")
        if not isinstance(exp, int) or exp <= now:
            return None, error(401, "'Expiration time' claim ('exp') must be a numeric value representing the "
                                    "future time at which the assertion expires")
        if exp > now + JWT_MAX_AHEAD_S:
            return None, error(401, "'Expiration time' claim ('exp') is too far in the future")
        return app, None

    def _issue(self, installation: Installation, body: dict[str, Any]) -> SimResponse:
        ids, names, asked = body.get("repository_ids", []), body.get("repositories", []), body.get("permissions")
        if not (isinstance(ids, list) and all(isinstance(i, int) for i in ids) and isinstance(names, list)
                and (asked is None or isinstance(asked, dict))):
            return error(422, "Invalid request")
        covered = {r: self.state.repositories[r] for r in installation.repository_ids if r in self.state.repositories}
        chosen = [covered.get(i) for i in ids] + [next((r for r in covered.values() if r.name == n), None)
                                                  for n in names]
        if any(r is None for r in chosen):
            return error(422, "There is at least one repository that does not exist or is not accessible to the "
                              "parent installation.")
        permissions = dict(installation.permissions if asked is None else asked)
        for name, level in permissions.items():
            if level not in LEVELS or not _allows(installation.permissions.get(name), level):
                return error(422, "The permissions requested are not granted to this installation.")
        repos = chosen or list(covered.values())
        expires = self.state.clock.now().replace(microsecond=0) + timedelta(seconds=TOKEN_LIFETIME_S)
        value = "ghs_" + "".join(secrets.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
                                 for _ in range(36))
        self.state.tokens[value] = Token(value, installation.id, [r.id for r in repos], permissions, expires)
        return SimResponse.json(201, {
            "token": value, "expires_at": iso_s(expires), "permissions": permissions,
            "repository_selection": "selected",
            "repositories": [{"id": r.id, "node_id": f"R_{r.id}", "name": r.name, "full_name": r.full_name,
                              "private": True, "owner": {"login": r.owner, "id": 1, "type": "Organization"}}
                             for r in repos],
        })


class Endpoints:
    """The repository endpoints, once authentication, permissions and limits have passed."""

    def __init__(self, state: GitHubState, repo: Repository, request: SimRequest) -> None:
        self.state, self.repo, self.request = state, repo, request
        self.api = request.base_url

    def answer(self, operation: str, match: dict[str, str]) -> SimResponse:
        if operation == "list_issues":
            return self.list_issues()
        issue = self.repo.issues.get(int(match["number"]))
        if issue is None:
            return error(404, "Not Found")
        if operation == "get_issue":
            return SimResponse.json(200, issue_payload(issue, self.repo, self.api))
        if operation == "update_issue":
            return self.update_issue(issue)
        if operation == "list_comments":
            return self.list_comments(issue)
        return self.create_comment(issue)

    def _body(self) -> dict[str, Any] | SimResponse:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            return error(400, "Problems parsing JSON")
        return body if isinstance(body, dict) else error(400, "Body should be a JSON object")

    def list_issues(self) -> SimResponse:
        param = self.request.param
        state, sort, direction = param("state") or "open", param("sort") or "created", param("direction") or "desc"
        for name, value, allowed in (("state", state, ("open", "closed", "all")),
                                     ("sort", sort, ("created", "updated", "comments")),
                                     ("direction", direction, ("asc", "desc"))):
            if value not in allowed:
                return invalid(name)
        since = None
        if param("since") is not None:
            since = parse_time(param("since"))
            if since is None:
                return invalid("since")
        per_page, page = positive(param("per_page"), default=30), positive(param("page"), default=1)
        if per_page is None or page is None:
            return invalid("per_page" if per_page is None else "page")
        per_page = min(per_page, 100)
        rows = [i for i in self.repo.issues.values() if (state == "all" or i.state == state)
                and (since is None or i.updated_at > since)]
        # in the order asked for: a descending walk is the ascending one over negated positions
        sign = 1 if direction == "asc" else -1

        def signed(position: tuple[int, int]) -> tuple[int, int]:
            return sign * position[0], sign * position[1]

        def place(issue: Issue) -> tuple[int, int]:
            return signed(_position(issue, sort))

        rows.sort(key=place)
        after = param("after")  # present, even empty (the first cursor page): cursor pagination
        if after:
            position = _decode_position(after)
            if position is None:
                return invalid("after")
            # the rows past the cursor's position (positions are unique: the id breaks ties)
            rows = rows[bisect.bisect_right(rows, signed(position), key=place):]
        elif after is not None:
            pass  # the first page in the cursor form: its links carry `after=`
        elif (page - 1) * per_page >= DEEP_PAGE_ROWS:
            return error(422, DEEP_PAGE_MESSAGE)
        else:
            rows = rows[(page - 1) * per_page:]
        chunk = rows[:per_page]
        kept = {k: v[-1] for k, v in self.request.query.items() if k not in ("after", "before", "page")}
        base = f"{self.api}/repositories/{self.repo.id}/issues"
        headers = {}
        if self.state.issue_paging == "page" and after is None:
            total_pages = max((page - 1) + (len(rows) + per_page - 1) // per_page, 1)
            headers = _page_links(base, {**kept, "per_page": per_page}, page, total_pages)
        elif len(rows) > per_page:
            query = urlencode({**kept, "per_page": per_page, "after": _encode_position(_position(chunk[-1], sort)),
                               "page": page + 1})
            headers["Link"] = f'<{base}?{query}>; rel="next"'
        return self._conditional(200, [issue_payload(i, self.repo, self.api) for i in chunk], headers)

    def _conditional(self, status: int, payload: Any, headers: dict[str, str]) -> SimResponse:
        content = json.dumps(payload).encode()
        etag = 'W/"' + hashlib.sha256(content + headers.get("Link", "").encode()).hexdigest()[:32] + '"'
        if self.request.headers.get("if-none-match") == etag:
            return SimResponse(304, b"", {"ETag": etag})
        return SimResponse(status, content, {"content-type": "application/json; charset=utf-8", "ETag": etag,
                                             **headers})

    def list_comments(self, issue: Issue) -> SimResponse:
        per_page = positive(self.request.param("per_page"), default=30)
        page = positive(self.request.param("page"), default=1)
        if per_page is None or page is None:
            return invalid("per_page" if per_page is None else "page", "IssueComment")
        per_page = min(per_page, 100)
        comments = sorted(issue.comments, key=lambda c: c.id)
        pages = max((len(comments) + per_page - 1) // per_page, 1)
        chunk = comments[(page - 1) * per_page: page * per_page]
        base = f"{self.api}/repositories/{self.repo.id}/issues/{issue.number}/comments"
        links = []
        if page < pages:
            links.append(f'<{base}?{urlencode({"per_page": per_page, "page": page + 1})}>; rel="next"')
            links.append(f'<{base}?{urlencode({"per_page": per_page, "page": pages})}>; rel="last"')
        headers = {"Link": ", ".join(links)} if links else {}
        return self._conditional(200, [comment_payload(c, issue, self.repo, self.api) for c in chunk], headers)

    def create_comment(self, issue: Issue) -> SimResponse:
        body = self._body()
        if isinstance(body, SimResponse):
            return body
        text = body.get("body")
        if not isinstance(text, str) or not text.strip():
            return error(422, "Validation Failed", errors=[{"resource": "IssueComment", "field": "body",
                                                            "code": "missing_field"}])
        if len(text) > COMMENT_MAX_CHARS:
            return error(422, "Validation Failed", errors=[{"resource": "IssueComment", "code": "custom",
                                                            "field": "body", "message": "Body is too long (maximum "
                                                            f"is {COMMENT_MAX_CHARS} characters)"}])
        now = self.state.clock.now()
        comment = Comment(self.state.next_id(), text, User(41898282, "nexus-intake[bot]", "Bot"), now)
        issue.comments.append(comment)
        issue.updated_at = now  # a comment touches its issue
        location = f"{self.api}/repos/{self.repo.full_name}/issues/comments/{comment.id}"
        return SimResponse.json(201, comment_payload(comment, issue, self.repo, self.api), {"Location": location})

    def update_issue(self, issue: Issue) -> SimResponse:
        body = self._body()
        if isinstance(body, SimResponse):
            return body
        wanted, reason = body.get("state"), body.get("state_reason")
        if wanted is not None and wanted not in ("open", "closed"):
            return invalid("state")
        if reason not in (None, "completed", "not_planned", "reopened", "duplicate"):
            return error(422, "Please specify a valid state reason.")
        for name in ("title", "body"):
            if name in body and not (isinstance(body[name], str) or (name == "body" and body[name] is None)):
                return error(422, "Invalid request")
        now, changed = self.state.clock.now(), False
        if wanted == "closed" and issue.state == "open":
            issue.state, issue.state_reason, issue.closed_at, changed = "closed", reason or "completed", now, True
        elif wanted == "open" and issue.state == "closed":
            issue.state, issue.state_reason, issue.closed_at, changed = "open", "reopened", None, True
        for name in ("title", "body"):
            if name in body and body[name] != getattr(issue, name):
                setattr(issue, name, body[name])
                changed = True
        if changed:
            issue.updated_at = now
        return SimResponse.json(200, issue_payload(issue, self.repo, self.api))


def app_key_pair(key_size: int = 2048) -> tuple[str, str]:
    """(private PEM, public PEM) of a fresh App key (2048-bit, as GitHub makes them): made
    when needed, never stored."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=key_size)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private, public


def build_github_app(state: GitHubState):
    return build_app(GitHubSimulator(state))
