"""The Jira world: a `World` of the shared conformance suite over the Jira simulator.

One world is one simulator with one site (its cloud id), one project, one service account
whose profile time zone is not UTC (so every JQL date is really converted), an API token
with scopes made fresh per world behind an `env:` reference, and the project permissions
the connector needs (read:jira-user too: composition reads the account's profile zone).
Sub-tasks are the excluded work type.
"""

from __future__ import annotations

import secrets
import uuid
from datetime import UTC, datetime

from nexus_pipelines.connectors.core.compose import compose
from nexus_pipelines.connectors.core.registration import Registration, parse_registration
from nexus_pipelines.connectors.core.registry import ComposeContext
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.local.simulators.gitlab import SimClock
from nexus_pipelines.local.simulators.http import Fault, SimulatorTransport
from nexus_pipelines.local.simulators.jira import SUBTASK, JiraSimulator, JiraState
from nexus_pipelines.local.worlds.simulated import SimulatorWorld, SwitchTransport

PROJECT_ID = 10000
DONE_STATUS = 10002
API_URL = "https://api.atlassian.example.test"
SITE_URL = "https://acme.atlassian.example.test"
EMAIL = "nexus-bot@serviceaccount.atlassian.example.test"
TIME_ZONE = "Australia/Sydney"  # UTC+11 in November: a JQL date written in UTC would mean another instant
TOKEN_ENV = "NEXUS_TEST_JIRA_TOKEN"
BOT = "712020:5f2d1c7e-7b5e-4bb1-a1cd-3f0c2e1d9a10"

_OPERATIONS = {"list": "search_issues", "comment": "add_comment", "close": "do_transition", "lookup": "get_comments",
               "read_issue": "get_issue"}
_LIMITED = {"X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "0", "RateLimit-Reason": "jira-quota-based"}


def new_token() -> str:
    """An API token shaped like Atlassian's (ATATT3...), made at test time."""
    return "ATATT3x" + secrets.token_urlsafe(140)


def _fault(name: str) -> Fault:
    return {
        "throttled": Fault(status=429, headers={**_LIMITED, "Retry-After": "1"}),
        "throttled_long": Fault(status=429, headers={**_LIMITED, "Retry-After": "3600"}),
        "provider_5xx": Fault(status=500, body={"errorMessages": ["Internal server error"], "errors": {}}),
        "authentication": Fault(status=401, body={"code": 401, "message": "Unauthorized"}),
        "authorization": Fault(status=401, body={"code": 401, "message": "Unauthorized; scope does not match"}),
        "ordinary_4xx": Fault(status=404, body={"errorMessages": ["Issue does not exist or you do not have "
                                                                  "permission to see it."], "errors": {}}),
        "invalid_payload": Fault(status=200, body={"issues": [{"id": 10001, "key": "PLAT-1"}], "isLast": True}),
    }[name]


class JiraWorld(SimulatorWorld):
    kind = "jira"
    operations = _OPERATIONS
    route = staticmethod(JiraSimulator.route)
    provider_fault = staticmethod(_fault)

    def __init__(self, *, project_id: int = PROJECT_ID, cloud_id: str | None = None, token: str | None = None,
                 clock: SimClock | None = None) -> None:
        self.state = JiraState(clock or SimClock(datetime(2026, 11, 1, 9, 0, tzinfo=UTC)))
        self.cloud_id = cloud_id or str(uuid.uuid4())
        self.project_id = project_id
        self.token = token or new_token()
        self.state.add_project(self.cloud_id, project_id, f"P{project_id}")
        self.state.add_account(BOT, EMAIL, "nexus bot", TIME_ZONE)
        self.state.add_token(self.token, EMAIL)
        self.state.grant(self.cloud_id, project_id, BOT)
        self.simulator = JiraSimulator(self.state)
        self.transport = SimulatorTransport(self.simulator)
        self.environ = {TOKEN_ENV: self.token}
        self.secret_values = (self.token,)

    def provider(self, **changes) -> dict:
        return {"api_url": API_URL, "site_url": SITE_URL, "cloud_id": self.cloud_id, "project_id": self.project_id,
                "done_status_id": DONE_STATUS, "jql_time_zone": TIME_ZONE, "email": EMAIL,
                "token": f"env:{TOKEN_ENV}", **changes}

    def registration(self, *, key: str = "conformance", tenant: str = "acme", project: str = "conformance",
                     page_size: int = 100, **provider) -> Registration:
        data = {"key": key, "tenant": tenant, "project": project, "kind": "jira", "page_size": page_size,
                "poll_interval_seconds": 60, "provider": self.provider(**provider)}
        return parse_registration(data, REGISTRY, source=f"{key}.yaml")

    def adapter(self, registration: Registration | None = None, transport=None):
        """Composed over the simulator (composition reads the account's profile zone), then
        answering over `transport` if given. The composition's own request is not kept in
        `transport.requests`, which records the invocations' (`state.calls` counts it)."""
        route = SwitchTransport(self.transport)
        before = len(self.transport.requests)
        adapter = compose(registration or self.registration(), REGISTRY, ComposeContext(transport=route),
                          environ=self.environ)
        del self.transport.requests[before:]
        route.inner = transport or self.transport
        return adapter

    def ref(self, issue_id: int) -> str:
        return f"jira:{self.cloud_id}:{issue_id}"

    @staticmethod
    def issue_id(external_ref: str) -> int:
        return int(external_ref.rsplit(":", 1)[1])

    def _add_issue(self, title: str, *, body: str, labels: list[str], updated_at: datetime) -> str:
        issue = self.state.add_issue(self.cloud_id, self.project_id, summary=title, description=body, labels=labels,
                                     updated_at=updated_at)
        return self.ref(issue.id)

    def _retitle(self, external_ref: str, title: str) -> None:
        self.state.update_issue(self.cloud_id, self.issue_id(external_ref), summary=title)

    def delete_issue(self, external_ref: str) -> None:
        with self.state._lock:
            del self.state.issues[(self.cloud_id, self.issue_id(external_ref))]

    def index_late(self, external_ref: str, until: datetime) -> None:
        """Keep the issue out of search results until `until` (its reindex lags behind)."""
        self.state.index_late(self.cloud_id, self.issue_id(external_ref), until)

    def add_excluded_item(self) -> None:
        self.state.add_issue(self.cloud_id, self.project_id, summary="A sub-task, not a ticket", issuetype=SUBTASK)
        self.state.clock.advance(0.001)

    def issue_state(self, external_ref: str) -> str:
        status = self.state.issue(self.cloud_id, self.issue_id(external_ref)).status
        return "closed" if status == DONE_STATUS else "open"

    def comments(self, external_ref: str) -> list[str]:
        return self.state.comment_texts(self.cloud_id, self.issue_id(external_ref))

    def add_comment(self, external_ref: str, body: str) -> None:
        self.state.add_comment(self.cloud_id, self.issue_id(external_ref), body)
