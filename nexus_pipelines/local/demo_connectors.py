"""The issue-intake part of `make demo`: a GitLab, a GitHub and a Jira registration side by
side, each against its simulator on loopback, through the code location's own Dagster jobs.

1. serve the GitLab simulator on 127.0.0.1:18929, the GitHub simulator on 127.0.0.1:18930
   and the Jira simulator on 127.0.0.1:18931 (their data persists in
   `.nexus_local/simulators/`, like a real tracker between demo runs) and seed a project,
   a repository and a Jira project the first time (with a task, a pull request and a
   sub-task that the connectors skip); the GitHub App's key and the Jira API token are
   made fresh each run and only reach the registrations through environment variables;
2. activate the `demo-gitlab`, `demo-github` and `demo-jira` registrations
   (configs/connectors/local);
3. per registration, run the poll, receipt-router and drain jobs: issues in, tickets out
   (UNTRIAGED, P2);
4. record one accepted success proof and drain: one marked comment, the issue closed;
5. poll once more (the close-back changed the issue: one observation), then run
   everything again: nothing new is written (custody, digests and the receipt).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dagster import DagsterInstance

DEMO_ISSUES = 24
GITLAB_PROJECT_ID, GITLAB_PORT = 278964, 18929
# The GitLab simulator's demo credential: not a secret, read through the reference the registration names.
GITLAB_TOKEN = "demo-gitlab-project-token-not-a-secret"
GITLAB_TOKEN_ENV = "NEXUS_DEMO_GITLAB_TOKEN"
GITHUB_PORT, GITHUB_KEY_ENV = 18930, "NEXUS_DEMO_GITHUB_APP_KEY"
JIRA_PORT, JIRA_TOKEN_ENV, JIRA_ACCOUNT = 18931, "NEXUS_DEMO_JIRA_TOKEN", "712020:nexus-demo"


def _issues(add, skipped) -> None:
    start = datetime.now(UTC) - timedelta(days=3)
    for n in range(DEMO_ISSUES):
        add(f"Platform issue {n + 1}", f"Reported problem {n + 1}.", ["bug"] if n % 3 == 0 else ["feature"],
            start + timedelta(minutes=n))
    skipped()


@dataclass
class DemoTracker:
    """One simulator the demo serves and the registration that polls it."""

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


def _gitlab(local_dir: Path) -> DemoTracker:
    from nexus_pipelines.local.simulators.gitlab import GitLabState, build_gitlab_app

    state, state_file = GitLabState(), local_dir / "simulators" / "gitlab.json"
    if not state.load(state_file):
        state.add_project(GITLAB_PROJECT_ID, "acme/platform")
        _issues(lambda t, d, labels, at: state.add_issue(GITLAB_PROJECT_ID, title=t, description=d, labels=labels,
                                                         updated_at=at),
                lambda: state.add_issue(GITLAB_PROJECT_ID, title="A task the connector skips", issue_type="task"))
    state.add_token(GITLAB_TOKEN, GITLAB_PROJECT_ID, scopes=("api",))
    os.environ[GITLAB_TOKEN_ENV] = GITLAB_TOKEN
    return DemoTracker("gitlab", "acme/demo-gitlab", "a task", state, build_gitlab_app(state), GITLAB_PORT, state_file)


def _github(local_dir: Path, registration) -> DemoTracker:
    from nexus_pipelines.local.simulators.github import GitHubState, app_key_pair, build_github_app

    config = registration.provider
    state, state_file = GitHubState(), local_dir / "simulators" / "github.json"
    if not state.load(state_file):
        state.add_repository(config.repository_id, config.owner, config.repo)
        _issues(lambda t, d, labels, at: state.add_issue(config.repository_id, title=t, body=d, labels=labels,
                                                         updated_at=at),
                lambda: state.add_issue(config.repository_id, title="A pull request the connector skips",
                                        pull_request=True))
    private, public = app_key_pair()  # a fresh App key each run; only the public half is registered
    state.add_app(config.app_id, public)
    state.install(config.installation_id, config.app_id, [config.repository_id])
    os.environ[GITHUB_KEY_ENV] = private
    return DemoTracker("github", "acme/demo-github", "a pull request", state, build_github_app(state), GITHUB_PORT,
                       state_file)


def _jira(local_dir: Path, registration) -> DemoTracker:
    from nexus_pipelines.local.simulators.jira import SUBTASK, JiraState, build_jira_app

    config = registration.provider
    state, state_file = JiraState(), local_dir / "simulators" / "jira.json"
    if not state.load(state_file):
        state.add_project(config.cloud_id, config.project_id, "PLAT")
        _issues(lambda t, d, labels, at: state.add_issue(config.cloud_id, config.project_id, summary=t, description=d,
                                                         labels=labels, updated_at=at),
                lambda: state.add_issue(config.cloud_id, config.project_id, summary="A sub-task the connector skips",
                                        issuetype=SUBTASK))
    token = "ATATT3x" + secrets.token_urlsafe(140)  # a fresh API token each run, never written anywhere
    state.add_account(JIRA_ACCOUNT, config.email, "nexus demo", config.jql_time_zone)
    state.add_token(token, config.email)
    state.grant(config.cloud_id, config.project_id, JIRA_ACCOUNT)
    os.environ[JIRA_TOKEN_ENV] = token
    return DemoTracker("jira", "acme/demo-jira", "a sub-task", state, build_jira_app(state), JIRA_PORT, state_file)


def _counts(conn, registration_id: str) -> dict[str, int]:
    tenant, _, key = registration_id.partition("/")
    one = lambda sql: conn.execute(sql, (tenant, key)).fetchone()[0]  # noqa: E731
    return {
        "tickets": one("SELECT count(*) FROM ticket_custody_links WHERE tenant = %s AND registration_key = %s"),
        "observations": one("SELECT count(*) FROM ticket_observations o JOIN ticket_custody_links l USING (ticket_id)"
                            " WHERE l.tenant = %s AND l.registration_key = %s"),
        "close commands": one("SELECT count(*) FROM ticket_close_commands WHERE tenant = %s AND registration_key = %s"),
        "close receipts": one("SELECT count(*) FROM ticket_close_receipts r JOIN ticket_close_commands c"
                              " USING (command_id) WHERE c.tenant = %s AND c.registration_key = %s"),
    }


def _run_jobs(instance: DagsterInstance, dsn: str, registration_id: str) -> dict:
    from nexus_pipelines import bindings
    from nexus_pipelines.connectors.core import store
    from nexus_pipelines.connectors.jobs import connectors_poll_job
    from nexus_pipelines.control.db import connect
    from nexus_pipelines.control.resources import ControlPlaneResource
    from nexus_pipelines.workqueue.jobs import build_drain_job, build_router_job

    with connect(dsn) as conn:
        store.request_poll(conn, [registration_id])  # poll now, whatever the schedule says
    resources = {"control_plane": ControlPlaneResource(dsn=dsn)}
    quiet = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}  # the summary reports each run
    poll = connectors_poll_job.execute_in_process(
        run_config={**quiet, "ops": {"connectors_poll_op": {"config": {"registrations": [registration_id]}}}},
        resources=resources, instance=instance, raise_on_error=False)
    router = build_router_job(bindings.build_route_table).execute_in_process(run_config=quiet, resources=resources,
                                                                             instance=instance)
    drain = build_drain_job(bindings.build_handler_registry).execute_in_process(
        run_config={**quiet, "ops": {"workqueue_drain_op": {"config": {"registration_ids": [registration_id],
                                                                       "time_budget_s": 60}}}},
        resources=resources, instance=instance)
    if not poll.success:
        failure = next((e for e in poll.all_events if e.is_step_failure), None)
        raise RuntimeError(failure.step_failure_data.user_failure_data.description if failure and
                           failure.step_failure_data.user_failure_data else "the poll run failed")
    return {"poll": poll.output_for_node("connectors_poll_op")["totals"],
            "routed": router.output_for_node("workqueue_receipt_router_op")["materialized"],
            "drained": drain.output_for_node("workqueue_drain_op")["completed"]}


def run_connector_demo(echo: Callable[[str], None], *, dsn: str, local_dir: Path, instance: DagsterInstance) -> int:
    from nexus_pipelines.connectors.registry import LOCAL_REGISTRATIONS_DIR, load_registrations
    from nexus_pipelines.local.simulators.http import serve_in_thread

    registrations = load_registrations(LOCAL_REGISTRATIONS_DIR)
    trackers = [_gitlab(local_dir), _github(local_dir, registrations["acme/demo-github"]),
                _jira(local_dir, registrations["acme/demo-jira"])]
    stops = []
    try:
        for tracker in trackers:
            try:
                url, stop = serve_in_thread(tracker.app, port=tracker.port)
            except RuntimeError as exc:
                echo(f"error: {exc}; stop whatever uses port {tracker.port} (an earlier demo?) and run make demo "
                     "again")
                return 1
            stops.append(stop)
            echo(f"{tracker.name} simulator on {url} (data in {tracker.state_file})")
        ok = [_run_registration(echo, tracker, registrations[tracker.registration_id], dsn=dsn, instance=instance)
              for tracker in trackers]
    finally:
        for stop in stops:
            stop()
        for tracker in trackers:
            tracker.state.save(tracker.state_file)
    echo("  the runs are in the Dagster UI of `make dev` (jobs connectors_poll, workqueue_drain)")
    return 0 if all(ok) else 1


def _run_registration(echo: Callable[[str], None], tracker: DemoTracker, registration, *, dsn: str,
                      instance: DagsterInstance) -> bool:
    from nexus_pipelines.cli_common import operator
    from nexus_pipelines.connectors.core.activation import activate
    from nexus_pipelines.connectors.registry import REGISTRY
    from nexus_pipelines.control.db import connect
    from nexus_pipelines.tickets.handlers import route_versions
    from nexus_pipelines.tickets.proofs import record_proof
    from nexus_pipelines.tickets.queries import list_tickets

    rid = registration.registration_id
    with connect(dsn) as conn:
        activate(conn, registration, REGISTRY, recorded_by="demo", route_versions=route_versions(),
                 drain_old=lambda *_: _run_jobs(instance, dsn, rid))
    first = _run_jobs(instance, dsn, rid)
    with connect(dsn) as conn:
        after_intake = _counts(conn, rid)
        ticket = list_tickets(conn, registration_id=rid, limit=1)[0]
        proof = record_proof(conn, ticket.ticket_id, evidence="fixed in release 2026.12 (demo)",
                             recorded_by=operator(), client_request_id="demo:first-ticket")
    _run_jobs(instance, dsn, rid)  # the drain posts the marked comment and closes the issue
    _run_jobs(instance, dsn, rid)  # the poll observes the closed issue: one more observation
    with connect(dsn) as conn:
        after_close = _counts(conn, rid)
    replay = _run_jobs(instance, dsn, rid)
    with connect(dsn) as conn:
        after_replay = _counts(conn, rid)
    state, comments = tracker.issue(ticket.external_ref)
    marked = [c for c in comments if f"[nexus:close:{proof.command_id.removeprefix('close-')}]" in c]
    p = first["poll"]
    echo("")
    echo(f"{registration.key} issue intake summary")
    echo(f"  poll       {p['pages']} pages, {p['issues_seen']} issues seen, {p['admitted']} new versions, "
         f"{p['excluded']} excluded ({tracker.skipped}), {p['api_calls']} API calls; {first['drained']} work items "
         "applied")
    echo(f"  tickets    {after_intake['tickets']} connector tickets, each UNTRIAGED at P2 "
         "(`nexus-pipelines tickets list`)")
    echo(f"  close-back ticket {ticket.ticket_id} ({ticket.external_ref}) proof {proof.proof_id}"
         f"{'' if proof.created else ' (recorded by an earlier demo)'}: the issue is {state}, "
         f"{len(marked)} marked comment, {after_close['close receipts']} close receipt")
    unchanged = after_replay == after_close
    echo(f"  replay     poll + route + drain again: {replay['poll']['admitted']} new versions, "
         f"{'nothing changed' if unchanged else 'CHANGED: ' + str(after_replay)}")
    return unchanged and len(marked) == 1 and state == "closed" and after_close["close receipts"] >= 1
