"""The GitHub world: a `World` of the shared conformance suite over the GitHub simulator.

One world is one simulator with one App (its public key registered), one installation
on one repository and the App's private key behind an `env:` reference. The adapter is
composed through the static registry; composition is the trusted path that mints the
first installation token, so `adapter(transport=...)` composes over the world's own
transport and only then routes the adapter's invocations through the given wrapper
(the suite's wrappers measure invocations, which a composition-time credential exchange
is not part of).
"""

from __future__ import annotations

import dataclasses
import functools
from datetime import UTC, datetime, timedelta

import httpx

from nexus_pipelines.connectors.core.compose import compose
from nexus_pipelines.connectors.core.registration import Registration, parse_registration
from nexus_pipelines.connectors.core.registry import ComposeContext, ConnectorRegistry
from nexus_pipelines.connectors.github import SPEC
from nexus_pipelines.connectors.github.adapter import build
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.local.simulators.github import SECONDARY_MESSAGE, GitHubSimulator, GitHubState, User
from nexus_pipelines.local.simulators.gitlab import SimClock
from nexus_pipelines.local.simulators.http import Fault, SimulatorTransport
from nexus_pipelines.local.worlds.github_keys import shared_key_pair
from nexus_pipelines.local.worlds.simulated import SimulatorWorld, SwitchTransport

REPOSITORY_ID = 1296269
APP_ID = 4242
INSTALLATION_ID = 77001
API_URL = "https://api.github.example.test"
KEY_ENV = "NEXUS_TEST_GITHUB_APP_KEY"

_OPERATIONS = {"list": "list_issues", "comment": "create_comment", "close": "update_issue", "lookup": "list_comments",
               "read_issue": "get_issue"}


def primary_limit_headers(reset_epoch: int) -> dict[str, str]:
    return {"x-ratelimit-limit": "5000", "x-ratelimit-remaining": "0", "x-ratelimit-used": "5000",
            "x-ratelimit-reset": str(reset_epoch), "x-ratelimit-resource": "core"}


def _on_clock(clock) -> ConnectorRegistry:
    return ConnectorRegistry([dataclasses.replace(SPEC, build=functools.partial(build, clock=clock))])


class GitHubWorld(SimulatorWorld):
    kind = "github"
    operations = _OPERATIONS
    route = staticmethod(GitHubSimulator.route)

    def __init__(self, *, repository_id: int = REPOSITORY_ID, key_pair: tuple[str, str] | None = None,
                 clock: SimClock | None = None, issue_paging: str = "after", on_sim_clock: bool = False,
                 server_clock_skew_s: float = 0.0) -> None:
        self.private_key, public_key = key_pair or shared_key_pair()
        # server_clock_skew_s: GitHub's clock runs this far ahead of the local one (negative: behind)
        start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=server_clock_skew_s)
        self.state = GitHubState(clock or SimClock(start))
        self.state.issue_paging = issue_paging  # "page": the listing links page numbers only
        # the adapter's own clock is the simulator's, for worlds that move time by hours
        self.registry = _on_clock(lambda: self.state.clock.now().timestamp()) if on_sim_clock else REGISTRY
        self.repository_id = repository_id
        self.state.add_app(APP_ID, public_key)
        self.state.add_repository(repository_id, "acme", f"platform-{repository_id}")
        self.state.install(INSTALLATION_ID, APP_ID, [repository_id])
        self.simulator = GitHubSimulator(self.state)
        self.transport = SimulatorTransport(self.simulator)
        self.environ = {KEY_ENV: self.private_key}

    @property
    def secret_values(self) -> tuple[str, ...]:
        """The App's private key and every installation token the simulator issued."""
        return (self.private_key, *self.state.tokens)

    def registration(self, *, key: str = "conformance", tenant: str = "acme", project: str = "conformance",
                     page_size: int = 100) -> Registration:
        repo = self.state.repositories[self.repository_id]
        data = {
            "key": key, "tenant": tenant, "project": project, "kind": "github", "page_size": page_size,
            "poll_interval_seconds": 60,
            "provider": {"api_url": API_URL, "app_id": APP_ID, "installation_id": INSTALLATION_ID,
                         "repository_id": self.repository_id, "owner": repo.owner, "repo": repo.name,
                         "private_key": f"env:{KEY_ENV}"},
        }
        return parse_registration(data, REGISTRY, source=f"{key}.yaml")

    def adapter(self, registration: Registration | None = None, transport: httpx.BaseTransport | None = None):
        route = SwitchTransport(self.transport)
        adapter = compose(registration or self.registration(), self.registry, ComposeContext(transport=route),
                          environ=self.environ)
        route.inner = transport or self.transport
        return adapter

    def _ref(self, number: int) -> str:
        return f"github:{self.repository_id}:{number}"

    def _number(self, external_ref: str) -> int:
        return int(external_ref.rsplit(":", 1)[1])

    def _add_issue(self, title: str, *, body: str, labels: list[str], updated_at: datetime) -> str:
        issue = self.state.add_issue(self.repository_id, title=title, body=body, labels=labels, updated_at=updated_at)
        return self._ref(issue.number)

    def _retitle(self, external_ref: str, title: str) -> None:
        self.state.update_issue(self.repository_id, self._number(external_ref), title=title)

    def delete_issue(self, external_ref: str) -> None:
        del self.state.repositories[self.repository_id].issues[self._number(external_ref)]

    def add_excluded_item(self) -> None:
        self.state.add_issue(self.repository_id, title="A pull request, not an issue", pull_request=True)
        self.state.clock.advance(0.001)

    def issue_state(self, external_ref: str) -> str:
        return self.state.issue(self.repository_id, self._number(external_ref)).state

    def comments(self, external_ref: str) -> list[str]:
        return [c.body for c in self.state.issue(self.repository_id, self._number(external_ref)).comments]

    def add_comment(self, external_ref: str, body: str) -> None:
        self.state.add_comment(self.repository_id, self._number(external_ref), body, User(8, "someone"))

    def provider_fault(self, name: str) -> Fault:
        reset = int(self.state.clock.now().timestamp()) + 3600
        return {
            "throttled": Fault(status=403, headers={"retry-after": "1"},
                               body={"message": SECONDARY_MESSAGE, "documentation_url": "https://docs.github.com/"
                                     "rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"}),
            "throttled_long": Fault(status=403, headers=primary_limit_headers(reset),
                                    body={"message": f"API rate limit exceeded for installation ID {INSTALLATION_ID}."}),
            "provider_5xx": Fault(status=500, body={"message": "Server Error"}),
            "authentication": Fault(status=401, body={"message": "Bad credentials"}),
            "authorization": Fault(status=403, headers={"x-accepted-github-permissions": "issues=write"},
                                   body={"message": "Resource not accessible by integration"}),
            "ordinary_4xx": Fault(status=404, body={"message": "Not Found"}),
            "invalid_payload": Fault(status=200, body=[{"id": "not-a-number", "number": 1}]),
        }[name]
