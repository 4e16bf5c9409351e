"""A stateful GitLab simulator: the parts of REST API v4 the GitLab connector uses.

Modelled on GitLab's documentation: project issues (offset pagination with `x-next-page`
empty on the last page, `x-total`/`x-total-pages` and the `last` link dropped above
10,000 rows; keyset pagination with `pagination=keyset` and a `Link rel="next"` only,
unless `GitLabState.keyset_for_issues` is False: then, like a GitLab that does not offer
keyset pagination for issues, `pagination=keyset` is ignored and offset pages come back),
`updated_after`/`updated_before` inclusive, `order_by` defaulting to `created_at` and
`sort` to `desc`, `per_page` capped at 100, notes (list with `sort`/`order_by`, create
with a required body of at most 1,000,000 characters; a note touches the issue's
`updated_at`), issue edits with `state_event`, project access tokens (`PRIVATE-TOKEN`
or `Authorization: Bearer`, scopes `api`/`read_api`, expiry, revocation, one project
each), 401/403/404 bodies, rate limits (429 with `Retry-After` and `RateLimit-*`
headers; note creation's application limit sends neither), moved projects (301), and
`Date` headers from the simulator's clock.

State changes are live: an update between two page requests really moves the issue
in the next page. Timestamps have millisecond precision, as GitLab's do.
"""

from __future__ import annotations

import base64
import bisect
import email.utils
import itertools
import json
import re
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from nexus_pipelines.local.simulators.http import FaultQueue, SimClock, Simulator, SimRequest, SimResponse
from nexus_pipelines.local.simulators.http import SimulatorState, build_app, find_route, parse_time, positive

OFFSET_TOTAL_LIMIT = 10_000
NOTE_MAX_CHARS = 1_000_000
TITLE_MAX_CHARS = 255
ISSUE_ORDERS = ("created_at", "updated_at", "priority", "due_date", "relative_position", "label_priority",
                "milestone_due", "popularity", "weight", "title")
KEYSET_ORDERS = ("created_at", "updated_at", "title", "due_date", "relative_position", "weight")
ISSUE_TYPES = ("issue", "incident", "test_case", "task")

_ROUTES = (
    (re.compile(r"^/api/v4/projects/(\d+)/issues/(\d+)/notes$"), {"GET": "list_notes", "POST": "create_note"}),
    (re.compile(r"^/api/v4/projects/(\d+)/issues/(\d+)$"), {"GET": "get_issue", "PUT": "edit_issue"}),
    (re.compile(r"^/api/v4/projects/(\d+)/issues$"), {"GET": "list_issues"}),
)


def iso_ms(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class User:
    id: int
    username: str
    name: str

    def payload(self, base_url: str) -> dict[str, Any]:
        return {"id": self.id, "username": self.username, "name": self.name, "state": "active", "locked": False,
                "avatar_url": None, "web_url": f"{base_url}/{self.username}"}


@dataclass
class Note:
    id: int
    body: str
    author: User
    created_at: datetime
    system: bool = False


@dataclass
class Issue:
    id: int
    iid: int
    project_id: int
    title: str
    description: str | None
    state: str
    labels: list[str]
    author: User
    created_at: datetime
    updated_at: datetime
    closed_at: datetime | None = None
    issue_type: str = "issue"
    notes: list[Note] = field(default_factory=list)


@dataclass
class Project:
    id: int
    path_with_namespace: str
    issues: dict[int, Issue] = field(default_factory=dict)
    moved_to: int | None = None  # answers 301 to this project's URL


@dataclass
class AccessToken:
    value: str
    project_id: int
    scopes: tuple[str, ...]
    expires_at: datetime | None
    user: User
    revoked: bool = False


@dataclass
class RateLimit:
    limit: int  # requests per window per token
    window_s: int = 60
    send_headers: bool = True


class GitLabState(SimulatorState):
    """Everything the simulator knows; thread-safe (the served app runs handlers on a pool)."""

    def __init__(self, clock: SimClock | None = None) -> None:
        self.clock = clock or SimClock()
        self.projects: dict[int, Project] = {}
        self.tokens: dict[str, AccessToken] = {}
        self.faults = FaultQueue()
        self.rate_limit: RateLimit | None = None
        self.keyset_for_issues = True  # False: `pagination=keyset` is ignored, issues come in offset pages
        # with keyset_for_issues False: refuse `pagination=keyset` with GitLab's 405 (as endpoints whose
        # keyset pagination is not available do) instead of ignoring it
        self.keyset_refused_with_405 = False
        self.note_rate_limit: RateLimit | None = None  # application limit on note creation
        self.limited_calls = 0  # requests that arrived after a 429 of the same window had been answered
        self._window: dict[tuple[str, str, int], int] = Counter()
        self._ids = itertools.count(1000)
        self._lock = threading.RLock()
        self.calls: Counter[str] = Counter()
        self.bot = User(9001, "project_278964_bot", "nexus bot")

    # -- setup ----------------------------------------------------------------------

    def add_project(self, project_id: int, path: str) -> Project:
        with self._lock:
            project = self.projects.setdefault(project_id, Project(project_id, path))
            return project

    def add_token(self, value: str, project_id: int, *, scopes: tuple[str, ...] = ("api",),
                  expires_at: datetime | None = None) -> AccessToken:
        with self._lock:
            token = AccessToken(value, project_id, scopes, expires_at, User(next(self._ids), f"project_{project_id}_bot",
                                                                            f"project {project_id} bot"))
            self.tokens[value] = token
            return token

    def revoke(self, value: str) -> None:
        with self._lock:
            self.tokens[value].revoked = True

    def add_issue(self, project_id: int, *, title: str, description: str | None = "", labels: list[str] | None = None,
                  updated_at: datetime | None = None, issue_type: str = "issue", author: User | None = None) -> Issue:
        with self._lock:
            project = self.projects[project_id]
            iid = max(project.issues, default=0) + 1
            now = updated_at or self.clock.now()
            issue = Issue(next(self._ids), iid, project_id, title, description, "opened", list(labels or []),
                          author or User(7, "reporter", "Rita Reporter"), now, now, issue_type=issue_type)
            project.issues[iid] = issue
            return issue

    def update_issue(self, project_id: int, iid: int, *, updated_at: datetime | None = None, **changes: Any) -> Issue:
        with self._lock:
            issue = self.projects[project_id].issues[iid]
            for name, value in changes.items():
                setattr(issue, name, value)
            issue.updated_at = updated_at or self.clock.now()
            return issue

    def notes(self, project_id: int, iid: int) -> list[Note]:
        with self._lock:
            return list(self.projects[project_id].issues[iid].notes)

    def issue(self, project_id: int, iid: int) -> Issue:
        with self._lock:
            return self.projects[project_id].issues[iid]

    # -- persistence (the local stack keeps its simulator's data across restarts) ------

    def _records(self) -> dict[str, Any]:
        return {"projects": [{"id": p.id, "path": p.path_with_namespace,
                              "issues": [asdict(i) for i in p.issues.values()]} for p in self.projects.values()]}

    def _restore(self, data: dict[str, Any]) -> None:
        for p in data["projects"]:
            project = self.add_project(p["id"], p["path"])
            for raw in p["issues"]:
                issue = _issue_from_record(raw)
                project.issues[issue.iid] = issue

    # -- request accounting ----------------------------------------------------------

    def _over_limit(self, limit: RateLimit | None, bucket: str, token: str) -> dict[str, str] | None:
        """None when the request may proceed, else the 429 headers (empty when the limit sends none)."""
        if limit is None:
            return None
        now = self.clock.now()
        window = int(now.timestamp()) // limit.window_s
        key = (bucket, token, window)
        self._window[key] += 1
        if self._window[key] <= limit.limit:
            return None
        if self._window[key] > limit.limit + 1:
            self.limited_calls += 1
        if not limit.send_headers:
            return {}
        reset = (window + 1) * limit.window_s
        return {
            "Retry-After": str(max(reset - int(now.timestamp()), 1)),
            "RateLimit-Name": "throttle_authenticated_api",
            "RateLimit-Limit": str(limit.limit),
            "RateLimit-Observed": str(self._window[key]),
            "RateLimit-Remaining": "0",
            "RateLimit-Reset": str(reset),
            "RateLimit-ResetTime": email.utils.format_datetime(datetime.fromtimestamp(reset, UTC), usegmt=True),
        }


def _issue_from_record(raw: dict[str, Any]) -> Issue:
    def when(value: str | None) -> datetime | None:
        return datetime.fromisoformat(value) if value else None

    author = User(**raw["author"])
    notes = [Note(n["id"], n["body"], User(**n["author"]), when(n["created_at"]), n["system"]) for n in raw["notes"]]
    return Issue(raw["id"], raw["iid"], raw["project_id"], raw["title"], raw["description"], raw["state"],
                 raw["labels"], author, when(raw["created_at"]), when(raw["updated_at"]), when(raw["closed_at"]),
                 raw["issue_type"], notes)


# -- payloads --------------------------------------------------------------------------


def issue_payload(issue: Issue, project: Project, base_url: str) -> dict[str, Any]:
    web = f"{base_url}/{project.path_with_namespace}/-/issues/{issue.iid}"
    return {
        "id": issue.id, "iid": issue.iid, "project_id": issue.project_id, "title": issue.title,
        "description": issue.description, "state": issue.state, "created_at": iso_ms(issue.created_at),
        "updated_at": iso_ms(issue.updated_at), "closed_at": iso_ms(issue.closed_at) if issue.closed_at else None,
        "closed_by": None, "labels": list(issue.labels), "milestone": None, "assignees": [], "assignee": None,
        "author": issue.author.payload(base_url), "type": issue.issue_type.upper(), "user_notes_count":
        sum(1 for n in issue.notes if not n.system), "merge_requests_count": 0, "upvotes": 0, "downvotes": 0,
        "due_date": None, "confidential": False, "discussion_locked": None, "issue_type": issue.issue_type,
        "web_url": web, "time_stats": {"time_estimate": 0, "total_time_spent": 0},
        "task_completion_status": {"count": 0, "completed_count": 0}, "has_tasks": True,
        "references": {"short": f"#{issue.iid}", "relative": f"#{issue.iid}",
                       "full": f"{project.path_with_namespace}#{issue.iid}"},
        "severity": "UNKNOWN", "moved_to_id": None,
        "_links": {"self": f"{base_url}/api/v4/projects/{issue.project_id}/issues/{issue.iid}",
                   "notes": f"{base_url}/api/v4/projects/{issue.project_id}/issues/{issue.iid}/notes"},
    }


def note_payload(note: Note, issue: Issue, base_url: str) -> dict[str, Any]:
    return {
        "id": note.id, "type": None, "body": note.body, "attachment": None, "author": note.author.payload(base_url),
        "created_at": iso_ms(note.created_at), "updated_at": iso_ms(note.created_at), "system": note.system,
        "noteable_id": issue.id, "noteable_type": "Issue", "noteable_iid": issue.iid, "project_id": issue.project_id,
        "resolvable": False, "confidential": False, "internal": False,
    }


def _error(status: int, message: Any) -> SimResponse:
    return SimResponse.json(status, {"message": message})


def _bad_param(name: str) -> SimResponse:
    return SimResponse.json(400, {"error": f"{name} does not have a valid value"})


def _params(request: SimRequest) -> tuple[dict[str, Any], SimResponse | None]:
    """A write's form or JSON body, or GitLab's 400 for one it cannot read."""
    try:
        return request.form_or_json(), None
    except (ValueError, UnicodeDecodeError):
        return {}, SimResponse.json(400, {"error": "400 Bad request - body is not valid"})


# -- the handler -------------------------------------------------------------------------


class GitLabSimulator(Simulator):
    """The GitLab API: `route` names the operation, `_answer` serves it."""

    fault_body = {"message": "500 Internal Server Error"}

    @staticmethod
    def route(request: SimRequest) -> tuple[str, tuple[int, ...] | None]:
        operation, match = find_route(_ROUTES, request)
        return operation, None if match is None else tuple(int(g) for g in match.groups())

    def _answer(self, request: SimRequest, operation: str, route: tuple[int, ...] | None) -> SimResponse:
        if route is None:
            return _error(404, "404 Not Found")
        if operation == "method_not_allowed":
            return _error(405, "405 Method Not Allowed")
        state = self.state
        with state._lock:
            token, denied = self._authenticate(request, route[0], write=request.method != "GET")
            if denied is not None:
                return denied
            project = state.projects[route[0]]
            if project.moved_to is not None:
                target = request.path.replace(f"/projects/{project.id}", f"/projects/{project.moved_to}", 1)
                return SimResponse.json(301, {"message": "301 Moved Permanently"},
                                        {"Location": f"{request.base_url}{target}"})
            limited = state._over_limit(state.rate_limit, "api", token.value)
            if limited is None and operation == "create_note":
                limited = state._over_limit(state.note_rate_limit, "notes", token.value)
            if limited is not None:
                if not limited:
                    return SimResponse.json(429, {"message": {"error": "This endpoint has been requested too many "
                                                                       "times. Try again later."}})
                return SimResponse.text(429, "Retry later\n", limited)
            if operation == "list_issues":
                return self._list_issues(request, project)
            issue = project.issues.get(route[1])
            if issue is None:
                return _error(404, "404 Not found")
            if operation == "get_issue":
                return SimResponse.json(200, issue_payload(issue, project, request.base_url))
            if operation == "edit_issue":
                return self._edit_issue(request, project, issue)
            if operation == "list_notes":
                return self._list_notes(request, issue)
            return self._create_note(request, issue, token)

    def _authenticate(self, request: SimRequest, project_id: int, *, write: bool):
        raw = request.headers.get("private-token")
        auth = request.headers.get("authorization", "")
        if raw is None and auth.lower().startswith("bearer "):
            raw = auth[7:]
        token = self.state.tokens.get(raw or "")
        now = self.state.clock.now()
        if token is None or token.revoked or (token.expires_at is not None and token.expires_at <= now):
            return None, _error(401, "401 Unauthorized")
        if token.project_id != project_id or project_id not in self.state.projects:
            return None, _error(404, "404 Project Not Found")
        if write and "api" not in token.scopes:
            return None, SimResponse.json(403, {"error": "insufficient_scope", "error_description": "The request "
                                                "requires higher privileges than provided by the access token.",
                                                "scope": "api"})
        return token, None

    # -- issues -----------------------------------------------------------------------

    def _list_issues(self, request: SimRequest, project: Project) -> SimResponse:
        order_by = request.param("order_by") or "created_at"
        sort = request.param("sort") or "desc"
        if order_by not in ISSUE_ORDERS:
            return _bad_param("order_by")
        if sort not in ("asc", "desc"):
            return _bad_param("sort")
        state_filter = request.param("state")
        if state_filter not in (None, "opened", "closed", "all"):
            return _bad_param("state")
        issue_type = request.param("issue_type")
        if issue_type is not None and issue_type not in ISSUE_TYPES:
            return _bad_param("issue_type")
        bounds = {}
        for name in ("updated_after", "updated_before", "created_after", "created_before"):
            value = request.param(name)
            if value is not None:
                bounds[name] = parse_time(value)
                if bounds[name] is None:
                    return SimResponse.json(400, {"error": f"{name} is invalid"})
        per_page = _per_page(request.param("per_page"), default=20)
        if per_page is None:
            return _bad_param("per_page")
        key = (lambda i: (getattr(i, order_by) if order_by in ("created_at", "updated_at", "title") else i.id, i.id))
        ordered = sorted(project.issues.values(), key=key, reverse=sort == "desc")
        matches = (lambda i: _matches(i, state_filter, issue_type, bounds))
        base = f"{request.base_url}{request.path}"
        if request.param("pagination") == "keyset":
            if order_by not in KEYSET_ORDERS or (not self.state.keyset_for_issues and self.state.keyset_refused_with_405):
                return SimResponse.json(405, {"error": "Keyset pagination is not yet available for this type of "
                                                       "request"})
            if self.state.keyset_for_issues:
                return self._keyset_page(request, project, ordered, matches, key, sort, per_page, base)
        return self._offset_page(request, project, list(filter(matches, ordered)), per_page, base)

    def _keyset_page(self, request, project, ordered, matches, key, sort, per_page, base) -> SimResponse:
        start = 0
        cursor = request.param("cursor")
        if cursor:
            position = _decode_cursor(cursor)
            if position is None:
                return SimResponse.json(400, {"error": "cursor is invalid"})
            # the first issue past the cursor in the listing's order (the position's key is
            # monotone in it), so a page reads what it returns, not the whole project
            past = ((lambda i: _cursor_key(key(i)) > position) if sort == "asc"
                    else (lambda i: _cursor_key(key(i)) < position))
            start = bisect.bisect_left(ordered, True, key=past)
        after = list(itertools.islice(filter(matches, ordered[start:]), per_page + 1))
        page, more = after[:per_page], len(after) > per_page
        headers = {}
        if more and page:
            params = {k: v[-1] for k, v in request.query.items() if k != "cursor"}
            params["cursor"] = _encode_cursor(_cursor_key(key(page[-1])))
            headers["Link"] = f'<{base}?{urlencode(params)}>; rel="next"'
        return SimResponse.json(200, [issue_payload(i, project, request.base_url) for i in page], headers)

    def _offset_page(self, request, project, issues, per_page, base) -> SimResponse:
        page_number = positive(request.param("page"), default=1)
        if page_number is None:
            return _bad_param("page")
        return _offset_response(request, issues, per_page, page_number, base,
                                lambda i: issue_payload(i, project, request.base_url))

    def _edit_issue(self, request: SimRequest, project: Project, issue: Issue) -> SimResponse:
        params, refused = _params(request)
        if refused is not None:
            return refused
        event = params.get("state_event")
        if event is not None and event not in ("close", "reopen"):
            return _bad_param("state_event")
        if "title" in params and (not params["title"] or len(params["title"]) > TITLE_MAX_CHARS):
            return _error(400, {"title": ["is too long (maximum is 255 characters)"]})
        now = self.state.clock.now()
        changed = False
        if event == "close" and issue.state != "closed":
            issue.state, issue.closed_at, changed = "closed", now, True
        elif event == "reopen" and issue.state != "opened":
            issue.state, issue.closed_at, changed = "opened", None, True
        for name in ("title", "description"):
            if name in params and params[name] != getattr(issue, name):
                setattr(issue, name, params[name])
                changed = True
        if changed:
            issue.updated_at = now
        return SimResponse.json(200, issue_payload(issue, project, request.base_url))

    # -- notes ------------------------------------------------------------------------

    def _list_notes(self, request: SimRequest, issue: Issue) -> SimResponse:
        order_by = request.param("order_by") or "created_at"
        sort = request.param("sort") or "desc"
        if order_by not in ("created_at", "updated_at"):
            return _bad_param("order_by")
        if sort not in ("asc", "desc"):
            return _bad_param("sort")
        per_page = _per_page(request.param("per_page"), default=20)
        page_number = positive(request.param("page"), default=1)
        if per_page is None or page_number is None:
            return _bad_param("per_page" if per_page is None else "page")
        notes = sorted(issue.notes, key=lambda n: (n.created_at, n.id), reverse=sort == "desc")
        return _offset_response(request, notes, per_page, page_number, f"{request.base_url}{request.path}",
                                lambda n: note_payload(n, issue, request.base_url))

    def _create_note(self, request: SimRequest, issue: Issue, token: AccessToken) -> SimResponse:
        params, refused = _params(request)
        if refused is not None:
            return refused
        body = params.get("body")
        if not isinstance(body, str) or not body.strip():
            return SimResponse.json(400, {"error": "body is missing"})
        if len(body) > NOTE_MAX_CHARS:
            return _error(400, {"note": [f"is too long (maximum is {NOTE_MAX_CHARS} characters)"]})
        now = self.state.clock.now()
        note = Note(self.state.next_id(), body, token.user, now)
        issue.notes.append(note)
        issue.updated_at = now  # a note touches its noteable
        return SimResponse.json(201, note_payload(note, issue, request.base_url))


def _matches(issue: Issue, state_filter: str | None, issue_type: str | None, bounds: dict[str, datetime]) -> bool:
    if state_filter in ("opened", "closed") and issue.state != state_filter:
        return False
    if issue_type is not None and issue.issue_type != issue_type:
        return False
    checks = (("updated_after", issue.updated_at, 1), ("updated_before", issue.updated_at, -1),
              ("created_after", issue.created_at, 1), ("created_before", issue.created_at, -1))
    for name, value, direction in checks:
        bound = bounds.get(name)
        if bound is not None and (value < bound if direction > 0 else value > bound):
            return False
    return True


def _per_page(value: str | None, *, default: int) -> int | None:
    number = positive(value, default=default)
    return None if number is None else min(number, 100)


def _offset_response(request: SimRequest, rows: list, per_page: int, page: int, base: str,
                     render: Callable[[Any], dict]) -> SimResponse:
    total = len(rows)
    pages = max((total + per_page - 1) // per_page, 1)
    chunk = rows[(page - 1) * per_page: page * per_page]
    params = {k: v[-1] for k, v in request.query.items()}

    def link(number: int, rel: str) -> str:
        return f'<{base}?{urlencode({**params, "page": number, "per_page": per_page})}>; rel="{rel}"'

    headers = {"x-page": str(page), "x-per-page": str(per_page), "x-prev-page": str(page - 1) if page > 1 else "",
               "x-next-page": str(page + 1) if page < pages else ""}
    links = []
    if page < pages:
        links.append(link(page + 1, "next"))
    if page > 1:
        links.append(link(page - 1, "prev"))
    links.append(link(1, "first"))
    if total <= OFFSET_TOTAL_LIMIT:
        headers.update({"x-total": str(total), "x-total-pages": str(pages)})
        links.append(link(pages, "last"))
    headers["Link"] = ", ".join(links)
    return SimResponse.json(200, [render(r) for r in chunk], headers)


def _cursor_key(value: tuple) -> tuple:
    first, second = value  # timestamps compare as epoch milliseconds
    return (round(first.timestamp() * 1000) if isinstance(first, datetime) else first, second)


def _encode_cursor(position: tuple) -> str:
    return base64.urlsafe_b64encode(json.dumps({"k": position[0], "id": position[1]}).encode()).decode()


def _decode_cursor(cursor: str) -> tuple | None:
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return (data["k"], int(data["id"]))
    except (ValueError, KeyError, TypeError):
        return None


def build_gitlab_app(state: GitLabState):
    return build_app(GitLabSimulator(state))
