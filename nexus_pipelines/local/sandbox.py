"""The local stack's provider sandbox: the NexusCRM, GitLab, GitHub and Jira simulators on fixed
loopback ports with their demo credentials, and the Month End ARR source rows in the
BigQuery emulator, so every job of the code location runs from the Dagster UI of
`make dev` with no file edited. The rows are loaded when the sandbox starts; their load
is marked finished again well inside the local config's freshness window while it runs,
and whenever `local up` finds it running.

`nexus-pipelines local up` starts it as a detached process (`SandboxProcess`); `make demo`
serves the same simulators in its own process (it reads their state directly) and hands
the ports back to the detached process when it is done. The trackers keep their data in
`<local_dir>/simulators/`, like real trackers between runs. Every credential here is a
demo value of a simulator, never a secret, and reaches the code only through the
environment variables the registrations and job configs name.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from nexus_pipelines.local.pidfile import PidFile

if TYPE_CHECKING:
    from google.cloud import bigquery

CRM_PORT, GITLAB_PORT, GITHUB_PORT, JIRA_PORT = 18928, 18929, 18930, 18931  # configs/connectors/local names 3
PORTS = (CRM_PORT, GITLAB_PORT, GITHUB_PORT, JIRA_PORT)
Ports = tuple[int, int, int, int]
JIRA_ACCOUNT = "712020:nexus-demo"
DEMO_ISSUES = 24
GITLAB_PROJECT_ID = 278964
GITLAB_TOKEN = "demo-gitlab-project-token-not-a-secret"
CRM_CLIENT_ID, CRM_CLIENT_SECRET = "demo-crm-client-id", "demo-crm-client-secret"
SOURCE_DATASET, SOURCE_ROWS, REJECT_EVERY = "finance_marts", 3000, 250  # every 250th row: a negative ARR


def environment(local_dir: Path, ports: Ports = PORTS) -> dict[str, str]:
    """The variables that point the code location at the sandbox (written to `.nexus_local/env`)."""
    return {
        "NEXUSCRM_BASE_URL": f"http://127.0.0.1:{ports[0]}",
        "NEXUSCRM_CLIENT_ID": CRM_CLIENT_ID,
        "NEXUSCRM_CLIENT_SECRET": CRM_CLIENT_SECRET,
        "NEXUS_DEMO_GITLAB_TOKEN": GITLAB_TOKEN,
        "NEXUS_DEMO_GITHUB_APP_KEY": github_app_key(local_dir)[0],
        "NEXUS_DEMO_JIRA_TOKEN": jira_token(local_dir),
    }


def jira_token(local_dir: Path) -> str:
    """The sandbox's Jira API token (Atlassian's shape), made once and kept like the App key."""
    import secrets

    path = local_dir / "simulators" / "jira-token"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("ATATT3x" + secrets.token_urlsafe(140))
        path.chmod(0o600)
    return path.read_text()


def github_app_key(local_dir: Path) -> tuple[str, str]:
    """(private PEM, public PEM) of the sandbox's GitHub App, made once and kept in the stack's
    folder so the detached sandbox and every shell that sourced the env agree."""
    from cryptography.hazmat.primitives import serialization

    from nexus_pipelines.local.simulators.github import app_key_pair

    path = local_dir / "simulators" / "github-app-key.pem"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        private, _ = app_key_pair()
        path.write_text(private)
        path.chmod(0o600)
    private = path.read_text()
    key = serialization.load_pem_private_key(private.encode(), password=None)
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private, public


@dataclass
class Tracker:
    """One issue tracker simulator of the sandbox and the registration that polls it."""

    name: str  # gitlab | github | jira
    registration_id: str
    skipped: str  # what the connector skips there
    state: object
    app: object
    port: int
    state_file: Path

    def issue(self, external_ref: str) -> tuple[str, list[str]]:
        """(state, comment bodies) of an issue at the tracker."""
        _, container, number = external_ref.split(":")
        if self.name == "jira":
            from nexus_pipelines.local.simulators.jira import STATUSES

            issue = self.state.issue(container, int(number))
            done = STATUSES[issue.status][1] == "done"
            return ("closed" if done else "open"), self.state.comment_texts(container, int(number))
        issue = self.state.issue(int(container), int(number))
        if self.name == "gitlab":
            return ("closed" if issue.state == "closed" else "open"), [n.body for n in issue.notes]
        return issue.state, [c.body for c in issue.comments]


def _issues(add, skipped) -> None:
    start = datetime.now(UTC) - timedelta(days=3)
    for n in range(DEMO_ISSUES):
        add(f"Platform issue {n + 1}", f"Reported problem {n + 1}.", ["bug"] if n % 3 == 0 else ["feature"],
            start + timedelta(minutes=n))
    skipped()


def _gitlab(local_dir: Path, port: int) -> Tracker:
    from nexus_pipelines.local.simulators.gitlab import GitLabState, build_gitlab_app

    state, state_file = GitLabState(), local_dir / "simulators" / "gitlab.json"
    if not state.load(state_file):
        state.add_project(GITLAB_PROJECT_ID, "acme/platform")
        _issues(lambda t, d, labels, at: state.add_issue(GITLAB_PROJECT_ID, title=t, description=d, labels=labels,
                                                         updated_at=at),
                lambda: state.add_issue(GITLAB_PROJECT_ID, title="A task the connector skips", issue_type="task"))
    state.add_token(GITLAB_TOKEN, GITLAB_PROJECT_ID, scopes=("api",))
    return Tracker("gitlab", "acme/demo-gitlab", "a task", state, build_gitlab_app(state), port, state_file)


def _github(local_dir: Path, port: int) -> Tracker:
    from nexus_pipelines.connectors.registry import LOCAL_REGISTRATIONS_DIR, load_registrations
    from nexus_pipelines.local.simulators.github import GitHubState, build_github_app

    config = load_registrations(LOCAL_REGISTRATIONS_DIR)["acme/demo-github"].provider
    state, state_file = GitHubState(), local_dir / "simulators" / "github.json"
    if not state.load(state_file):
        state.add_repository(config.repository_id, config.owner, config.repo)
        _issues(lambda t, d, labels, at: state.add_issue(config.repository_id, title=t, body=d, labels=labels,
                                                         updated_at=at),
                lambda: state.add_issue(config.repository_id, title="A pull request the connector skips",
                                        pull_request=True))
    state.add_app(config.app_id, github_app_key(local_dir)[1])
    state.install(config.installation_id, config.app_id, [config.repository_id])
    return Tracker("github", "acme/demo-github", "a pull request", state, build_github_app(state), port, state_file)


def _jira(local_dir: Path, port: int) -> Tracker:
    from nexus_pipelines.connectors.registry import LOCAL_REGISTRATIONS_DIR, load_registrations
    from nexus_pipelines.local.simulators.jira import SUBTASK, JiraState, build_jira_app

    config = load_registrations(LOCAL_REGISTRATIONS_DIR)["acme/demo-jira"].provider
    state, state_file = JiraState(), local_dir / "simulators" / "jira.json"
    if not state.load(state_file):
        state.add_project(config.cloud_id, config.project_id, "PLAT")
        _issues(lambda t, d, labels, at: state.add_issue(config.cloud_id, config.project_id, summary=t, description=d,
                                                         labels=labels, updated_at=at),
                lambda: state.add_issue(config.cloud_id, config.project_id, summary="A sub-task the connector skips",
                                        issuetype=SUBTASK))
    state.add_account(JIRA_ACCOUNT, config.email, "nexus demo", config.jql_time_zone)
    state.add_token(jira_token(local_dir), config.email)
    state.grant(config.cloud_id, config.project_id, JIRA_ACCOUNT)
    return Tracker("jira", "acme/demo-jira", "a sub-task", state, build_jira_app(state), port, state_file)


def crm_state():
    """The CRM object as the month_end_arr mapper declares it, with the org's rule against negative ARR."""
    from nexus_pipelines.local.simulators.nexuscrm import NexusCrmState, rejects_negative
    from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper

    state = NexusCrmState(client_id=CRM_CLIENT_ID, client_secret=CRM_CLIENT_SECRET)
    state.define_object_from_contract(MonthEndArrMapper.TARGET_OBJECT, MonthEndArrMapper.FIELDS, key_prefix="a0M")
    state.add_validation_rule(MonthEndArrMapper.TARGET_OBJECT, rejects_negative("ARR_Amount__c"))
    return state


@contextmanager
def _emulator_client(bq_project: str, emulator_url: str) -> Iterator[bigquery.Client]:
    from nexus_pipelines.integrations.bigquery import make_bigquery_client

    client = make_bigquery_client(bq_project, "US", emulator_url)
    try:
        yield client
    finally:
        client.close()


def seed_source(bq_project: str, emulator_url: str) -> None:
    """A fresh load of the Month End ARR source rows (the readiness query wants a recent one)."""
    from nexus_pipelines.local.month_end_arr_source import seed_source as seed

    with _emulator_client(bq_project, emulator_url) as client:
        seed(client, SOURCE_DATASET, SOURCE_ROWS, negative_every=REJECT_EVERY, load_run_id=f"local-{int(time.time())}")


def mark_source_fresh(bq_project: str, emulator_url: str) -> None:
    """Another load of the (unchanged) source rows has just finished: the readiness query
    reads that load, so the local job config's freshness check passes for its window again."""
    from nexus_pipelines.local.month_end_arr_source import mark_load

    with _emulator_client(bq_project, emulator_url) as client:
        mark_load(client, SOURCE_DATASET, load_run_id=f"local-{int(time.time())}")


def mark_interval_s() -> float:
    """How often the running sandbox marks its load again: a sixth of the local job config's
    freshness window (every 30 minutes of 180), well inside it."""
    from nexus_pipelines.writeback.config import load_config
    from nexus_pipelines.writeback.registry import get_job

    window = load_config(get_job("month_end_arr").local_config_path).config.source.freshness_max_age_minutes
    return window * 60 / 6


def keep_source_fresh(bq_project: str, emulator_url: str, stop: threading.Event,
                      every_s: float | None = None) -> None:
    """Mark the source load fresh every `every_s` seconds until `stop` is set. A mark that
    fails (the emulator is down) is logged and tried again at the next turn; the simulators
    keep serving meanwhile."""
    from nexus_pipelines.redaction import describe_exception

    every_s = every_s or mark_interval_s()
    while not stop.wait(every_s):
        try:
            mark_source_fresh(bq_project, emulator_url)
        except Exception as exc:  # noqa: BLE001 - any failure: the next turn tries again
            print(f"marking the source load fresh failed ({describe_exception(exc)}); trying again in "
                  f"{every_s:.0f}s, or run `nexus-pipelines local up`", flush=True)


class Sandbox:
    """The simulators served in this process; `stop` saves the trackers' data."""

    def __init__(self, local_dir: Path, ports: Ports = PORTS) -> None:
        from nexus_pipelines.local.simulators.nexuscrm import build_nexuscrm_app

        self.local_dir = local_dir
        self.crm_port = ports[0]
        self.crm = crm_state()
        self.crm_app = build_nexuscrm_app(self.crm)
        self.trackers = [_gitlab(local_dir, ports[1]), _github(local_dir, ports[2]), _jira(local_dir, ports[3])]
        self._stops: list[Callable[[], None]] = []

    def serve(self) -> list[str]:
        """Serve all of them; returns their URLs. Raises RuntimeError naming a busy port."""
        from nexus_pipelines.local.simulators.http import serve_in_thread

        urls = []
        try:
            for app, port in [(self.crm_app, self.crm_port)] + [(t.app, t.port) for t in self.trackers]:
                url, stop = serve_in_thread(app, port=port)
                self._stops.append(stop)
                urls.append(url)
        except RuntimeError:
            self.stop()
            raise
        return urls

    def stop(self) -> None:
        for stop in self._stops:
            stop()
        self._stops.clear()
        for tracker in self.trackers:
            tracker.state.save(tracker.state_file)


class SandboxProcess:
    """The sandbox as a detached process of the local stack, found again through its pid file."""

    def __init__(self, local_dir: Path, ports: Ports = PORTS) -> None:
        self.local_dir = local_dir
        self.ports = ports
        self._pid_file = PidFile(local_dir / "sandbox.pid")
        self.log_file = local_dir / "sandbox.log"

    def running(self) -> bool:
        """Its process is alive and itself listens on every one of its ports."""
        from nexus_pipelines.local.ports import serves_all

        pid = self._pid_file.pid()
        return pid is not None and serves_all(pid, self.ports)

    def start(self, *, bq_project: str, emulator_url: str, timeout_s: float = 60.0) -> None:
        from nexus_pipelines.local.bigquery_emulator import is_serving
        from nexus_pipelines.local.ports import wait_until_served
        from nexus_pipelines.local.postgres import StackError

        if self.running():  # it seeded its load when it started: mark it fresh again now
            mark_source_fresh(bq_project, emulator_url)
            return
        self.stop()  # one that lost a port to another process is replaced, not left half serving
        self.local_dir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", __name__, "--dir", str(self.local_dir), "--bq-project", bq_project,
                 "--emulator-url", emulator_url, "--ports", ",".join(map(str, self.ports))],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self._pid_file.record(process.pid)
        problem = wait_until_served(process, self.ports, lambda port: is_serving(f"http://127.0.0.1:{port}"),
                                    timeout_s)
        if problem:
            self.stop()
            raise StackError(f"the simulators did not start on ports {', '.join(map(str, self.ports))} ({problem}); "
                             f"stop that process (another `make demo` or `make dev`?) and run `local up` again; "
                             f"see {self.log_file}")

    def stop(self) -> bool:
        """Stop it (it saves the trackers' data first); False when it was not running."""
        return self._pid_file.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description="Serve the local stack's provider sandbox until SIGTERM.")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--bq-project", required=True)
    parser.add_argument("--emulator-url", required=True)
    parser.add_argument("--ports", default=",".join(map(str, PORTS)))
    args = parser.parse_args()
    seed_source(args.bq_project, args.emulator_url)
    sandbox = Sandbox(args.dir, tuple(int(p) for p in args.ports.split(",")))
    for url in sandbox.serve():
        print(f"serving {url}", flush=True)
    done = threading.Event()
    threading.Thread(target=keep_source_fresh, args=(args.bq_project, args.emulator_url, done), daemon=True,
                     name="source-load").start()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    while not done.wait(30):
        for tracker in sandbox.trackers:  # a crash loses at most half a minute of tracker changes
            tracker.state.save(tracker.state_file)
    sandbox.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
