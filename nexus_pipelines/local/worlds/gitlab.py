"""The GitLab world: a `World` of the shared conformance suite over the GitLab simulator."""

from __future__ import annotations

from datetime import UTC, datetime

from nexus_pipelines.connectors.core.compose import compose
from nexus_pipelines.connectors.core.registration import Registration, parse_registration
from nexus_pipelines.connectors.core.registry import ComposeContext
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.local.simulators.gitlab import GitLabSimulator, GitLabState, SimClock
from nexus_pipelines.local.simulators.http import Fault, SimulatorTransport
from nexus_pipelines.local.worlds.simulated import SimulatorWorld
from nexus_pipelines.local.worlds.tokens import gitlab_token

PROJECT_ID = 278964
BASE_URL = "https://gitlab.example.test"
TOKEN_ENV = "NEXUS_TEST_GITLAB_TOKEN"

_OPERATIONS = {"list": "list_issues", "comment": "create_note", "close": "edit_issue", "lookup": "list_notes",
               "read_issue": "get_issue"}


def _fault(name: str) -> Fault:
    limit_headers = {"RateLimit-Name": "throttle_authenticated_api", "RateLimit-Limit": "600",
                     "RateLimit-Observed": "601", "RateLimit-Remaining": "0"}
    return {
        "throttled": Fault(status=429, headers={**limit_headers, "Retry-After": "1"}),
        "throttled_long": Fault(status=429, headers={**limit_headers, "Retry-After": "3600"}),
        "provider_5xx": Fault(status=500, body={"message": "500 Internal Server Error"}),
        "authentication": Fault(status=401, body={"message": "401 Unauthorized"}),
        "authorization": Fault(status=403, body={"error": "insufficient_scope", "scope": "api"}),
        "ordinary_4xx": Fault(status=404, body={"message": "404 Not found"}),
        "invalid_payload": Fault(status=200, body=[{"id": "not-a-number", "iid": 1}]),
    }[name]


class GitLabWorld(SimulatorWorld):
    kind = "gitlab"
    operations = _OPERATIONS
    route = staticmethod(GitLabSimulator.route)
    provider_fault = staticmethod(_fault)

    def __init__(self, *, project_id: int = PROJECT_ID, token: str = gitlab_token("conformance-0123456789abcd"),
                 keyset_for_issues: bool = True) -> None:
        self.state = GitLabState(SimClock(datetime(2026, 11, 1, 9, 0, tzinfo=UTC)))
        self.state.keyset_for_issues = keyset_for_issues  # False: issues come in offset pages
        self.project_id = project_id
        self.state.add_project(project_id, "acme/platform")
        self.state.add_token(token, project_id, scopes=("api",))
        self.simulator = GitLabSimulator(self.state)
        self.transport = SimulatorTransport(self.simulator)
        self.environ = {TOKEN_ENV: token}
        self.secret_values = (token,)

    def registration(self, *, key: str = "conformance", tenant: str = "acme", project: str = "conformance",
                     page_size: int = 100, project_id: int | None = None) -> Registration:
        data = {
            "key": key, "tenant": tenant, "project": project, "kind": "gitlab", "page_size": page_size,
            "poll_interval_seconds": 60,
            "provider": {"base_url": BASE_URL, "project_id": project_id or self.project_id,
                         "token": f"env:{TOKEN_ENV}"},
        }
        return parse_registration(data, REGISTRY, source=f"{key}.yaml")

    def adapter(self, registration: Registration | None = None, transport=None):
        return compose(registration or self.registration(), REGISTRY,
                       ComposeContext(transport=transport or self.transport), environ=self.environ)

    def _ref(self, iid: int) -> str:
        return f"gitlab:{self.project_id}:{iid}"

    def _iid(self, external_ref: str) -> int:
        return int(external_ref.rsplit(":", 1)[1])

    def _add_issue(self, title: str, *, body: str, labels: list[str], updated_at: datetime) -> str:
        issue = self.state.add_issue(self.project_id, title=title, description=body, labels=labels,
                                     updated_at=updated_at)
        return self._ref(issue.iid)

    def _retitle(self, external_ref: str, title: str) -> None:
        self.state.update_issue(self.project_id, self._iid(external_ref), title=title)

    def delete_issue(self, external_ref: str) -> None:
        del self.state.projects[self.project_id].issues[self._iid(external_ref)]

    def add_excluded_item(self) -> None:
        self.state.add_issue(self.project_id, title="A task, not an issue", issue_type="task")
        self.state.clock.advance(0.001)

    def issue_state(self, external_ref: str) -> str:
        return "closed" if self.state.issue(self.project_id, self._iid(external_ref)).state == "closed" else "open"

    def comments(self, external_ref: str) -> list[str]:
        return [n.body for n in self.state.notes(self.project_id, self._iid(external_ref)) if not n.system]

    def add_comment(self, external_ref: str, body: str) -> None:
        from nexus_pipelines.local.simulators.gitlab import Note, User

        issue = self.state.issue(self.project_id, self._iid(external_ref))
        issue.notes.append(Note(self.state.next_id(), body, User(8, "someone", "Some One"), self.state.clock.now()))
