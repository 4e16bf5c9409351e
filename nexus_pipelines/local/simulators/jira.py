"""A stateful Jira Cloud simulator: the parts of REST API v3 the Jira connector uses, behind
Atlassian's API gateway (`/ex/jira/{cloudId}/rest/api/3/...`).

Modelled on Atlassian's documentation: the enhanced search `GET /search/jql` (a bounded
JQL, see `jira_jql.py`; `fields` defaults to `id`; `maxResults` defaults to 50 and pages
hold at most 100 issues when fields beyond id/key are asked; `nextPageToken` is absent on
the last page, bound to its query and expires after 7 days; `isLast`), `GET /issue/{id}`,
comments (`GET` with `startAt`/`maxResults`/`orderBy=created` and `total`; `POST` with an
ADF `body`, 201; a comment touches the issue's `updated`), transitions (`GET` lists what
the account may do from the issue's status, a global transition even in its own
destination status, nothing without Transition issues; `POST`
with `{"transition": {"id": ...}}`, 204, 400 for a transition that is not available),
`GET /myself` (the calling account with its profile `timeZone`), HTTP basic auth with an
email and an API token with scopes (`read:jira-work` for reads, `write:jira-work` for
writes, `read:jira-user` for `/myself`: 401 "Unauthorized; scope does not match" otherwise;
expiry, revocation), project permissions (Browse projects, Add comments, Transition issues), rate
limits (429 with `Retry-After`, `X-RateLimit-*` and `RateLimit-Reason`) and `Date`.

Times have millisecond precision and are rendered with the account's UTC offset; JQL
dates are wall times in the account's profile time zone. State changes are live: an
update between two page requests moves the issue in the next page (the page token is a
keyset position over the query's sort order; `offset_page_tokens` makes it an offset, as
an opaque token may be), and `index_lag` keeps a change out of search results for a
while, as Jira's eventually consistent search may (`index_late` for one issue, so one
stamped before a scan can appear behind a scan's position). Each work type has its
own workflow, so transition ids differ between types. A site has several sub-task types
(`subtask` true, `hierarchyLevel` -1) and a team-managed project types of its own
(`scope` names the project).
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import hmac
import itertools
import json
import operator
import re
import secrets
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from nexus_pipelines.local.simulators import jira_adf, jira_jql
from nexus_pipelines.local.simulators.gitlab import SimClock
from nexus_pipelines.local.simulators.http import FaultQueue, Simulator, SimRequest, SimResponse, SimulatorState
from nexus_pipelines.local.simulators.http import build_app, find_route

READ_SCOPE, WRITE_SCOPE, USER_SCOPE = "read:jira-work", "write:jira-work", "read:jira-user"
BROWSE, COMMENT, TRANSITION = "BROWSE_PROJECTS", "ADD_COMMENTS", "TRANSITION_ISSUES"
PAGE_TOKEN_LIFETIME = timedelta(days=7)
MAX_FIELDS_PAGE, MAX_IDS_PAGE, DEFAULT_PAGE = 100, 5000, 50
FIELDS = ("summary", "description", "labels", "reporter", "status", "updated", "created", "project", "issuetype")
# status id -> (name, category key); category key -> (category id, name)
STATUSES = {10000: ("To Do", "new"), 10001: ("In Progress", "indeterminate"), 10002: ("Done", "done"),
            10003: ("Won't Do", "done")}
CATEGORIES = {"new": (2, "To Do"), "indeterminate": (4, "In Progress"), "done": (3, "Done")}
TASK, BUG, SUBTASK, REVIEW_SUBTASK, EPIC = 10001, 10004, 10003, 10005, 10000


@dataclass(frozen=True)
class IssueType:
    """A work type: Jira's hierarchy levels are 1 for an epic, 0 for a base type and -1 for
    a sub-task (`subtask` true); a team-managed project's types are its own (`project_id`)."""

    name: str
    hierarchy_level: int = 0
    project_id: int | None = None  # None: a company-managed type, shared by the site

    @property
    def subtask(self) -> bool:
        return self.hierarchy_level == -1


# A site has several sub-task types; team-managed projects add their own (`add_issue_type`).
ISSUE_TYPES = {TASK: IssueType("Task"), BUG: IssueType("Bug"), SUBTASK: IssueType("Sub-task", -1),
               REVIEW_SUBTASK: IssueType("Review", -1), EPIC: IssueType("Epic", 1)}

_REST = r"^/ex/jira/([0-9a-f-]{36})/rest/api/3"
_ROUTES = (
    (re.compile(_REST + r"/search/jql$"), {"GET": "search_issues"}),
    (re.compile(_REST + r"/issue/([^/]+)/comment$"), {"GET": "get_comments", "POST": "add_comment"}),
    (re.compile(_REST + r"/issue/([^/]+)/transitions$"), {"GET": "get_transitions", "POST": "do_transition"}),
    (re.compile(_REST + r"/issue/([^/]+)$"), {"GET": "get_issue"}),
    (re.compile(_REST + r"/(myself)$"), {"GET": "get_myself"}),
)
_PARAMS = {
    "search_issues": {"jql", "nextPageToken", "maxResults", "fields", "expand", "properties", "fieldsByKeys",
                      "failFast", "reconcileIssues"},
    "get_issue": {"fields", "expand", "properties", "fieldsByKeys", "updateHistory"},
    "get_comments": {"startAt", "maxResults", "orderBy", "expand"},
    "add_comment": {"expand"},
    "get_transitions": {"expand", "transitionId", "skipRemoteOnlyCondition", "includeUnavailableTransitions",
                        "sortByOpsBarAndStatus"},
    "do_transition": set(),
    "get_myself": {"expand"},
}
# The scope each operation's API token needs (Atlassian's classic scopes per operation).
_SCOPES = {"add_comment": WRITE_SCOPE, "do_transition": WRITE_SCOPE, "get_myself": USER_SCOPE}


@dataclass(frozen=True)
class WorkflowTransition:
    id: int
    name: str
    to: int
    sources: tuple[int, ...] | None = None  # None: a global transition, from any status (its own too)
    requires_resolution: bool = False  # its screen asks for a resolution


WORKFLOWS = {
    TASK: (WorkflowTransition(11, "To Do", 10000), WorkflowTransition(21, "In Progress", 10001),
           WorkflowTransition(31, "Done", 10002)),
    BUG: (WorkflowTransition(41, "Start progress", 10001, (10000,)),
          WorkflowTransition(51, "Resolve", 10002, (10000, 10001)),
          WorkflowTransition(61, "Reopen", 10000, (10002, 10003)),
          WorkflowTransition(71, "Won't do", 10003, (10000, 10001), requires_resolution=True)),
}
WORKFLOWS[SUBTASK] = WORKFLOWS[REVIEW_SUBTASK] = WORKFLOWS[EPIC] = WORKFLOWS[TASK]


@dataclass
class Account:
    account_id: str
    email: str
    display_name: str
    time_zone: str = "UTC"


@dataclass
class ApiToken:
    value: str
    email: str
    scopes: tuple[str, ...]
    expires_at: datetime | None = None
    revoked: bool = False


@dataclass
class Comment:
    id: int
    author: str  # account id
    body: dict
    created: datetime


@dataclass
class Issue:
    id: int
    key: str
    project_id: int
    summary: str
    description: dict | None
    labels: list[str]
    reporter: str | None  # account id
    status: int
    issuetype: int
    created: datetime
    updated: datetime
    comments: list[Comment] = field(default_factory=list)


@dataclass
class Project:
    id: int
    key: str
    name: str
    grants: dict[str, set[str]] = field(default_factory=dict)  # account id -> project permissions
    numbers: int = 0


@dataclass
class RateLimit:
    limit: int  # requests per window per token
    window_s: int = 60


class JiraState(SimulatorState):
    """Everything the simulator knows; thread-safe (the served app runs handlers on a pool)."""

    def __init__(self, clock: SimClock | None = None) -> None:
        self.clock = clock or SimClock()
        self.sites: set[str] = set()
        self.projects: dict[tuple[str, int], Project] = {}
        self.issues: dict[tuple[str, int], Issue] = {}
        self.accounts: dict[str, Account] = {}  # by account id
        self.tokens: dict[str, ApiToken] = {}
        self.issue_types: dict[int, IssueType] = dict(ISSUE_TYPES)
        self.faults = FaultQueue()
        self.rate_limit: RateLimit | None = None
        self.limited_calls = 0
        # Jira: "Recent updates might not be immediately visible in the returned search results."
        self.index_lag = timedelta(0)  # a change is searchable this long after it happened
        # one issue's change searchable only from a later moment (its reindex lagged behind):
        # an issue stamped before a scan can then appear among results a scan has passed
        self.searchable_from: dict[tuple[str, int], datetime] = {}
        # Atlassian documents nextPageToken as opaque; a site whose token holds an offset
        # (not a keyset position) shifts later issues back when one already read is updated.
        self.offset_page_tokens = False
        self.calls: Counter[str] = Counter()
        self._window: Counter[tuple[str, int]] = Counter()
        self._ids = itertools.count(10001)
        self._page_key = secrets.token_bytes(32)  # signs page tokens: a forged or edited one is refused
        self._lock = threading.RLock()
        self.reporter = self.add_account("5b10a2844c20165700ede21g", "reporter@example.test", "Mia Krystof")

    # -- setup --------------------------------------------------------------------------

    def add_site(self, cloud_id: str) -> None:
        with self._lock:
            self.sites.add(cloud_id)

    def add_project(self, cloud_id: str, project_id: int, key: str, name: str = "Platform") -> Project:
        with self._lock:
            self.sites.add(cloud_id)
            return self.projects.setdefault((cloud_id, project_id), Project(project_id, key, name))

    def add_account(self, account_id: str, email_address: str, display_name: str, time_zone: str = "UTC") -> Account:
        with self._lock:
            account = Account(account_id, email_address, display_name, time_zone)
            self.accounts[account_id] = account
            return account

    def add_issue_type(self, type_id: int, name: str, *, hierarchy_level: int = 0,
                       project_id: int | None = None) -> IssueType:
        """A work type; with `project_id`, one of that team-managed project's own (its workflow is the task's)."""
        with self._lock:
            self.issue_types[type_id] = IssueType(name, hierarchy_level, project_id)
            return self.issue_types[type_id]

    def add_token(self, value: str, email_address: str, *,
                  scopes: tuple[str, ...] = (READ_SCOPE, WRITE_SCOPE, USER_SCOPE),
                  expires_at: datetime | None = None) -> ApiToken:
        with self._lock:
            token = ApiToken(value, email_address, scopes, expires_at)
            self.tokens[value] = token
            return token

    def grant(self, cloud_id: str, project_id: int, account_id: str,
              permissions: tuple[str, ...] = (BROWSE, COMMENT, TRANSITION)) -> None:
        with self._lock:
            self.projects[(cloud_id, project_id)].grants[account_id] = set(permissions)

    def revoke(self, value: str) -> None:
        with self._lock:
            self.tokens[value].revoked = True

    def add_issue(self, cloud_id: str, project_id: int, *, summary: str, description: str | None = "",
                  labels: list[str] | None = None, issuetype: int = TASK, updated_at: datetime | None = None,
                  status: int = 10000) -> Issue:
        with self._lock:
            project = self.projects[(cloud_id, project_id)]
            scope = self.issue_types[issuetype].project_id
            if scope not in (None, project_id):
                raise ValueError(f"issue type {issuetype} belongs to team-managed project {scope}")
            project.numbers += 1
            now = updated_at or self.clock.now()
            issue = Issue(next(self._ids), f"{project.key}-{project.numbers}", project_id, summary,
                          jira_adf.document(description) if description else None, list(labels or []),
                          self.reporter.account_id, status, issuetype, now, now)
            self.issues[(cloud_id, issue.id)] = issue
            return issue

    def update_issue(self, cloud_id: str, issue_id: int, *, updated_at: datetime | None = None,
                     **changes: Any) -> Issue:
        with self._lock:
            issue = self.issues[(cloud_id, issue_id)]
            for name, value in changes.items():
                setattr(issue, name, value)
            issue.updated = updated_at or self.clock.now()
            return issue

    def index_late(self, cloud_id: str, issue_id: int, until: datetime) -> None:
        """Keep the issue out of search results until `until`, whatever its `updated` says."""
        with self._lock:
            self.searchable_from[(cloud_id, issue_id)] = until

    def searchable(self, cloud_id: str, issue: Issue, now: datetime) -> bool:
        if self.index_lag and issue.updated > now - self.index_lag:
            return False
        return self.searchable_from.get((cloud_id, issue.id), now) <= now

    def move_issue(self, cloud_id: str, issue_id: int, project_id: int) -> Issue:
        """Jira keeps the id and gives the issue a key in its new project."""
        with self._lock:
            project = self.projects[(cloud_id, project_id)]
            project.numbers += 1
            return self.update_issue(cloud_id, issue_id, project_id=project_id,
                                     key=f"{project.key}-{project.numbers}")

    def rename_project_key(self, cloud_id: str, project_id: int, key: str) -> None:
        """Jira re-keys every issue of the project; ids stay."""
        with self._lock:
            self.projects[(cloud_id, project_id)].key = key
            for (site, _), issue in self.issues.items():
                if site == cloud_id and issue.project_id == project_id:
                    issue.key = f"{key}-{issue.key.rsplit('-', 1)[1]}"

    def add_comment(self, cloud_id: str, issue_id: int, text: str, author: str | None = None) -> Comment:
        with self._lock:
            issue = self.issues[(cloud_id, issue_id)]
            comment = Comment(next(self._ids), author or self.reporter.account_id, jira_adf.document(text),
                              self.clock.now())
            issue.comments.append(comment)
            issue.updated = comment.created
            return comment

    def issue(self, cloud_id: str, issue_id: int) -> Issue:
        with self._lock:
            return self.issues[(cloud_id, issue_id)]

    def comment_texts(self, cloud_id: str, issue_id: int) -> list[str]:
        with self._lock:
            return [jira_adf.check(c.body) for c in self.issues[(cloud_id, issue_id)].comments]

    # -- persistence (the local stack keeps its simulator's data across restarts) ------

    def _records(self) -> dict[str, Any]:
        return {"projects": [{"site": site, **asdict(p), "grants": {}} for (site, _), p in self.projects.items()],
                "issues": [{"site": site, **asdict(i)} for (site, _), i in self.issues.items()],
                "issue_types": {str(k): asdict(t) for k, t in self.issue_types.items()}}

    def _restore(self, data: dict[str, Any]) -> None:
        for raw in data["projects"]:
            site = raw.pop("site")
            self.sites.add(site)
            self.projects[(site, raw["id"])] = Project(**{**raw, "grants": {}})
        for raw in data["issues"]:
            site = raw.pop("site")
            raw["comments"] = [Comment(c["id"], c["author"], c["body"], datetime.fromisoformat(c["created"]))
                               for c in raw["comments"]]
            for name in ("created", "updated"):
                raw[name] = datetime.fromisoformat(raw[name])
            self.issues[(site, raw["id"])] = Issue(**raw)
        for type_id, raw in data.get("issue_types", {}).items():
            self.issue_types[int(type_id)] = IssueType(**raw)

    # -- accounting -----------------------------------------------------------------------

    def _over_limit(self, token: str) -> dict[str, str] | None:
        """None when the request may proceed, else the 429's headers."""
        limit = self.rate_limit
        if limit is None:
            return None
        now = self.clock.now()
        window = int(now.timestamp()) // limit.window_s
        self._window[(token, window)] += 1
        if self._window[(token, window)] <= limit.limit:
            return None
        if self._window[(token, window)] > limit.limit + 1:
            self.limited_calls += 1  # a request after a 429 of the same window had been answered
        reset = datetime.fromtimestamp((window + 1) * limit.window_s, UTC)
        return {"Retry-After": str(max(int((reset - now).total_seconds()), 1)),
                "X-RateLimit-Limit": str(limit.limit), "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset": reset.strftime("%Y-%m-%dT%H:%MZ"), "RateLimit-Reason": "jira-quota-based"}

    def page_token(self, jql: str, position: list[int]) -> str:
        payload = json.dumps({"q": _digest(jql), "p": position, "t": int(self.clock.now().timestamp() * 1000)})
        signature = hmac.new(self._page_key, payload.encode(), hashlib.sha256).hexdigest()[:32]
        return base64.urlsafe_b64encode(f"{payload}|{signature}".encode()).decode().rstrip("=")

    def read_page_token(self, token: str, jql: str) -> list[int] | str:
        """The keyset position (or, with offset tokens, the offset) a token holds, or why it is refused."""
        try:
            payload, _, signature = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode().rpartition("|")
            data = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            return "The provided next page token is invalid."
        expected = hmac.new(self._page_key, payload.encode(), hashlib.sha256).hexdigest()[:32]
        if not hmac.compare_digest(signature, expected) or data.get("q") != _digest(jql):
            return "The provided next page token is invalid or does not belong to this query."
        issued = datetime.fromtimestamp(data["t"] / 1000, UTC)
        if self.clock.now() - issued >= PAGE_TOKEN_LIFETIME:
            return "The provided next page token has expired."
        return list(data["p"])


def _digest(jql: str) -> str:
    return hashlib.sha256(jql.encode()).hexdigest()[:16]


def jira_time(moment: datetime, zone: str) -> str:
    """Jira's form: 2026-11-01T20:00:00.000+1100, in the reader's zone."""
    local = moment.astimezone(ZoneInfo(zone))
    return local.strftime("%Y-%m-%dT%H:%M:%S.") + f"{local.microsecond // 1000:03d}" + local.strftime("%z")


def _error(status: int, *messages: str, **errors: str) -> SimResponse:
    return SimResponse.json(status, {"errorMessages": list(messages), "errors": errors})


def _gateway(status: int, message: str) -> SimResponse:
    return SimResponse.json(status, {"code": status, "message": message})


# -- payloads ----------------------------------------------------------------------------


class _Render:
    """Payloads for one request: links on the request's origin, times in the reader's zone."""

    def __init__(self, state: JiraState, request: SimRequest, site: str, reader: Account) -> None:
        self.state, self.base, self.site, self.zone = state, request.base_url, site, reader.time_zone

    def user(self, account_id: str) -> dict[str, Any]:
        account = self.state.accounts[account_id]
        return {"self": f"{self.base}/rest/api/3/user?accountId={account.account_id}",
                "accountId": account.account_id, "displayName": account.display_name, "active": True,
                "timeZone": account.time_zone, "accountType": "atlassian"}

    def myself(self, account: Account) -> dict[str, Any]:
        """GET /myself: the calling account, its profile time zone included (Jira gives the
        site's default zone when the profile sets none)."""
        return {**self.user(account.account_id), "emailAddress": account.email, "locale": "en_US",
                "avatarUrls": {"48x48": f"{self.base}/avatar/{account.account_id}/48"}}

    def status(self, status_id: int) -> dict[str, Any]:
        name, category = STATUSES[status_id]
        category_id, category_name = CATEGORIES[category]
        return {"self": f"{self.base}/rest/api/3/status/{status_id}", "description": "", "name": name,
                "id": str(status_id), "statusCategory": {"self": f"{self.base}/rest/api/3/statuscategory/"
                                                         f"{category_id}", "id": category_id, "key": category,
                                                         "name": category_name}}

    def issue(self, issue: Issue, fields: set[str]) -> dict[str, Any]:
        project = self.state.projects[(self.site, issue.project_id)]
        kind = self.state.issue_types[issue.issuetype]
        issuetype = {"self": f"{self.base}/rest/api/3/issuetype/{issue.issuetype}", "id": str(issue.issuetype),
                     "description": "", "name": kind.name, "subtask": kind.subtask,
                     "hierarchyLevel": kind.hierarchy_level, "avatarId": 10318}
        if kind.project_id is not None:
            issuetype["scope"] = {"type": "PROJECT", "project": {"id": str(kind.project_id)}}
        every = {
            "summary": issue.summary, "description": issue.description, "labels": list(issue.labels),
            "reporter": self.user(issue.reporter) if issue.reporter else None, "status": self.status(issue.status),
            "updated": jira_time(issue.updated, self.zone), "created": jira_time(issue.created, self.zone),
            "project": {"self": f"{self.base}/rest/api/3/project/{project.id}", "id": str(project.id),
                        "key": project.key, "name": project.name, "projectTypeKey": "software"},
            "issuetype": issuetype,
        }
        payload = {"expand": "renderedFields,names,schema,operations,editmeta,changelog,versionedRepresentations",
                   "id": str(issue.id), "self": f"{self.base}/rest/api/3/issue/{issue.id}", "key": issue.key}
        wanted = {name: every[name] for name in FIELDS if name in fields}
        return {**payload, "fields": wanted} if wanted else {"id": str(issue.id)}

    def comment(self, comment: Comment, issue: Issue) -> dict[str, Any]:
        when = jira_time(comment.created, self.zone)
        return {"self": f"{self.base}/rest/api/3/issue/{issue.id}/comment/{comment.id}", "id": str(comment.id),
                "author": self.user(comment.author), "updateAuthor": self.user(comment.author),
                "body": comment.body, "created": when, "updated": when, "jsdPublic": True}


# -- the handler -------------------------------------------------------------------------


class JiraSimulator(Simulator):
    """The whole API: `route` names the operation, `_answer` serves it (`Simulator.handle`
    counts it, answers its queued fault and dates the answer)."""

    fault_body = {"errorMessages": ["Internal server error"], "errors": {}}

    @staticmethod
    def route(request: SimRequest) -> tuple[str, tuple[str, ...] | None]:
        operation, match = find_route(_ROUTES, request)
        return operation, None if match is None else match.groups()

    def _answer(self, request: SimRequest, operation: str, route: tuple[str, ...] | None) -> SimResponse:
        if route is None:
            return _gateway(404, "Not Found")
        if operation == "method_not_allowed":
            return SimResponse.json(405, {"message": "Method Not Allowed"})
        state = self.state
        with state._lock:
            site = route[0]
            if site not in state.sites:
                return _gateway(404, "Cloud id not found")
            account, refused = self._authenticate(request, _SCOPES.get(operation, READ_SCOPE))
            if refused is not None:
                return refused
            limited = state._over_limit(request.headers["authorization"])
            if limited is not None:
                return SimResponse.json(429, {"message": "Rate limit exceeded"}, limited)
            unknown = sorted(set(request.query) - _PARAMS[operation])
            if unknown:
                return _error(400, f"Unrecognized query parameter: {unknown[0]}")
            render = _Render(state, request, site, account)
            if operation == "search_issues":
                return self._search(request, site, account, render)
            if operation == "get_myself":
                return SimResponse.json(200, render.myself(account))
            issue = self._visible_issue(site, route[1], account)
            if issue is None:
                return _error(404, "Issue does not exist or you do not have permission to see it.")
            handler = {"get_issue": self._get_issue, "get_comments": self._get_comments,
                       "add_comment": self._add_comment, "get_transitions": self._get_transitions,
                       "do_transition": self._do_transition}[operation]
            return handler(request, site, issue, account, render)

    def _authenticate(self, request: SimRequest, scope: str) -> tuple[Account | None, SimResponse | None]:
        header = request.headers.get("authorization", "")
        scheme, _, encoded = header.partition(" ")
        try:
            email_address, _, value = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            email_address, value = "", ""
        token = self.state.tokens.get(value)
        now = self.state.clock.now()
        if (scheme != "Basic" or token is None or token.revoked or token.email != email_address
                or (token.expires_at is not None and token.expires_at <= now)):
            return None, _gateway(401, "Unauthorized")
        if scope not in token.scopes:
            return None, _gateway(401, "Unauthorized; scope does not match")
        account = next(a for a in self.state.accounts.values() if a.email == email_address)
        return account, None

    def _may(self, site: str, project_id: int, account: Account, permission: str) -> bool:
        project = self.state.projects.get((site, project_id))
        return project is not None and permission in project.grants.get(account.account_id, set())

    def _visible_issue(self, site: str, ref: str, account: Account) -> Issue | None:
        issue = self.state.issues.get((site, int(ref))) if ref.isdigit() else next(
            (i for (s, _), i in self.state.issues.items() if s == site and i.key == ref.upper()), None)
        return issue if issue is not None and self._may(site, issue.project_id, account, BROWSE) else None

    # -- search ---------------------------------------------------------------------------

    def _search(self, request: SimRequest, site: str, account: Account, render: _Render) -> SimResponse:
        jql = request.param("jql")
        if not jql:
            return _error(400, "Unbounded JQL queries are not allowed here. Please add a search restriction to your "
                               "query.")
        try:
            query = jira_jql.parse(jql)
        except jira_jql.JqlError as exc:
            return _error(400, str(exc))
        project = next((p for (s, _), p in self.state.projects.items() if s == site and
                        query.project in (str(p.id), p.key)), None)
        if project is None or not self._may(site, project.id, account, BROWSE):
            return _error(400, f"The value '{query.project}' does not exist for the field 'project'.")
        fields = {f for value in request.query.get("fields", []) for f in value.split(",") if f}
        unknown = sorted(fields - set(FIELDS) - {"id", "key", "*all", "*navigable"})
        if unknown:
            return _error(400, f"Field '{unknown[0]}' does not exist or you do not have permission to view it.")
        if fields & {"*all", "*navigable"}:
            fields |= set(FIELDS)
        size = _int(request.param("maxResults"), DEFAULT_PAGE)
        if size is None or not 1 <= size <= MAX_IDS_PAGE:
            return _error(400, "maxResults must be a number between 1 and 5000.")
        size = min(size, MAX_FIELDS_PAGE if fields - {"id", "key"} else MAX_IDS_PAGE)
        zone = ZoneInfo(account.time_zone)
        position = _position([*query.order, *([] if ("id", False) in query.order else [("id", False)])])
        now = self.state.clock.now()
        matches = _matcher(query, zone)
        matching = sorted((i for (s, _), i in self.state.issues.items() if s == site and i.project_id == project.id
                           and matches(i) and self.state.searchable(s, i, now)), key=position)
        after, offset = matching, 0
        token = request.param("nextPageToken")
        if token is not None:
            start = self.state.read_page_token(token, jql)
            if isinstance(start, str):
                return _error(400, start)
            # an offset token counts from the front of the results as they are now; a keyset
            # token reads on from the last position served (positions are unique: id breaks ties)
            offset = start[0] if self.state.offset_page_tokens else bisect.bisect_right(matching, start, key=position)
            after = matching[offset:]
        page, more = after[:size], len(after) > size
        body: dict[str, Any] = {"issues": [render.issue(i, fields) for i in page], "isLast": not more}
        if more:
            held = [offset + len(page)] if self.state.offset_page_tokens else position(page[-1])
            body["nextPageToken"] = self.state.page_token(jql, held)
        return SimResponse.json(200, body)

    # -- one issue ------------------------------------------------------------------------

    def _get_issue(self, request: SimRequest, site: str, issue: Issue, account: Account,
                   render: _Render) -> SimResponse:
        fields = {f for value in request.query.get("fields", []) for f in value.split(",") if f} or set(FIELDS)
        return SimResponse.json(200, render.issue(issue, fields))

    def _get_comments(self, request: SimRequest, site: str, issue: Issue, account: Account,
                      render: _Render) -> SimResponse:
        start, size = _int(request.param("startAt"), 0), _int(request.param("maxResults"), MAX_IDS_PAGE)
        if start is None or size is None:
            return _error(400, "startAt and maxResults must be numbers.")
        order = request.param("orderBy")
        if order not in (None, "created", "-created", "+created"):
            return _error(400, "orderBy is set to a value other than created.")
        comments = sorted(issue.comments, key=lambda c: (c.created, c.id), reverse=order == "-created")
        size = min(size, MAX_IDS_PAGE)
        page = comments[start:start + size]
        return SimResponse.json(200, {"startAt": start, "maxResults": size, "total": len(comments),
                                      "comments": [render.comment(c, issue) for c in page]})

    def _add_comment(self, request: SimRequest, site: str, issue: Issue, account: Account,
                     render: _Render) -> SimResponse:
        body, refused = _json_body(request, {"body", "visibility", "properties"})
        if refused is not None:
            return refused
        if not self._may(site, issue.project_id, account, COMMENT):
            return _error(403, "You do not have the permission to comment on this issue.")
        try:
            jira_adf.check(body.get("body"))
        except jira_adf.AdfInvalid as exc:
            return _error(400, comment=f"Comment body is not valid: {exc}")
        now = self.state.clock.now()
        comment = Comment(self.state.next_id(), account.account_id, body["body"], now)
        issue.comments.append(comment)
        issue.updated = now  # a comment updates its issue
        return SimResponse.json(201, render.comment(comment, issue))

    def _available(self, site: str, issue: Issue, account: Account) -> list[WorkflowTransition]:
        if not self._may(site, issue.project_id, account, TRANSITION):
            return []
        # A global ("from any status") transition is offered in every status, its own
        # destination included, as Jira does unless a condition hides it.
        workflow = WORKFLOWS.get(issue.issuetype, WORKFLOWS[TASK])  # a team-managed type: the task's workflow
        return [t for t in workflow if t.sources is None or issue.status in t.sources]

    def _get_transitions(self, request: SimRequest, site: str, issue: Issue, account: Account,
                         render: _Render) -> SimResponse:
        return SimResponse.json(200, {"expand": "transitions", "transitions": [
            {"id": str(t.id), "name": t.name, "to": render.status(t.to), "hasScreen": t.requires_resolution,
             "isGlobal": t.sources is None, "isInitial": False, "isAvailable": True, "isConditional": False,
             "isLooped": False} for t in self._available(site, issue, account)]})

    def _do_transition(self, request: SimRequest, site: str, issue: Issue, account: Account,
                       render: _Render) -> SimResponse:
        body, refused = _json_body(request, {"transition", "fields", "update", "historyMetadata", "properties"})
        if refused is not None:
            return refused
        wanted = body.get("transition")
        if not isinstance(wanted, dict) or not isinstance(wanted.get("id"), str):
            return _error(400, "No transition was specified.")
        transition = next((t for t in self._available(site, issue, account) if str(t.id) == wanted["id"]), None)
        if transition is None:
            return _error(400, f"Transition id '{wanted['id']}' is not valid for this issue.")
        if transition.requires_resolution and "resolution" not in (body.get("fields") or {}):
            return _error(400, resolution="Resolution is required.")
        issue.status, issue.updated = transition.to, self.state.clock.now()
        return SimResponse(204, b"", {})


def _int(value: str | None, default: int) -> int | None:
    if value is None:
        return default
    return int(value) if value.isdigit() else None


_SORT_VALUES: dict[str, Callable[[Issue], int]] = {
    "updated": lambda issue: round(issue.updated.timestamp() * 1000),
    "created": lambda issue: round(issue.created.timestamp() * 1000),
    "key": lambda issue: issue.project_id * 10**9 + int(issue.key.rsplit("-", 1)[1]),
    "id": operator.attrgetter("id"),
}


def _position(order: list[tuple[str, bool]]) -> Callable[[Issue], list[int]]:
    """An issue's place in a query's sort order: the values a keyset page token holds."""
    values = [(_SORT_VALUES[name], -1 if descending else 1) for name, descending in order]
    return lambda issue: [value(issue) * sign for value, sign in values]


_COMPARE = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


def _matcher(query: jira_jql.Query, zone: ZoneInfo) -> Callable[[Issue], bool]:
    """The query's filter as a test of one issue; its bounds are placed in the zone once per search."""
    # fold 0: the earlier of an ambiguous wall time's instants; as a UTC instant, like the issues'
    # times, so a comparison needs no zone lookup
    bounds = [(operator.attrgetter(bound.name), _COMPARE[bound.op], bound.wall.replace(tzinfo=zone).astimezone(UTC))
              for bound in query.bounds]
    issuetype = query.issuetype

    def matches(issue: Issue) -> bool:
        if issuetype is not None and issuetype != str(issue.issuetype):
            return False
        for value_of, compare, limit in bounds:
            if not compare(value_of(issue), limit):
                return False
        return True

    return matches


def _json_body(request: SimRequest, allowed: set[str]) -> tuple[dict[str, Any], SimResponse | None]:
    if "application/json" not in request.headers.get("content-type", ""):
        return {}, SimResponse.json(415, {"message": "Unsupported Media Type"})
    try:
        body = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        return {}, _error(400, "Unexpected character in the request body: it is not JSON.")
    if not isinstance(body, dict):
        return {}, _error(400, "The request body must be a JSON object.")
    unknown = sorted(set(body) - allowed)
    if unknown:
        return {}, _error(400, f"Unrecognized field \"{unknown[0]}\".")
    return body, None


def build_jira_app(state: JiraState):
    return build_app(JiraSimulator(state))
