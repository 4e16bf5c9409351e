"""The issue-intake part of `make demo`: one GitLab registration against the GitLab
simulator on loopback, through the code location's own Dagster jobs.

1. serve the GitLab simulator on 127.0.0.1:18929 (its data persists in
   `.nexus_local/simulators/gitlab.json`, like a real GitLab between demo runs) and seed
   a project with issues the first time;
2. activate the `demo-gitlab` registration (configs/connectors/local);
3. run the poll, receipt-router and drain jobs: issues in, tickets out (UNTRIAGED, P2);
4. the demo commander sets the first ticket's priority and accepts it (through the
   same commands as the pages), then one accepted success proof is recorded and drained:
   one marked comment, the issue closed;
5. poll once more (the close-back changed the issue: one observation), then run
   everything again: nothing new is written (custody, digests and the receipt).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from dagster import DagsterInstance

DEMO_PROJECT_ID = 278964
DEMO_PORT = 18929
DEMO_ISSUES = 24
# The simulator's demo credential: not a secret, read through the reference the registration names.
DEMO_TOKEN = "demo-gitlab-project-token-not-a-secret"
TOKEN_ENV = "NEXUS_DEMO_GITLAB_TOKEN"


def _seed(state) -> None:
    from datetime import timedelta

    state.add_project(DEMO_PROJECT_ID, "acme/platform")
    start = state.clock.now() - timedelta(days=3)
    for n in range(DEMO_ISSUES):
        labels = ["bug"] if n % 3 == 0 else ["feature"]
        state.add_issue(DEMO_PROJECT_ID, title=f"Platform issue {n + 1}", description=f"Reported problem {n + 1}.",
                        labels=labels, updated_at=start + timedelta(minutes=n))
    state.add_issue(DEMO_PROJECT_ID, title="A task the connector skips", issue_type="task")


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


def _accept_as_demo_commander(conn, ticket_id: int, project_id: str) -> None:
    """Only an ACCEPTED ticket takes a proof: the demo's commander decides as a person would."""
    from nexus_pipelines.actors.store import ActorError, add_actor, authenticate, grant, reissue
    from nexus_pipelines.tickets.commands import set_connector_ticket_priority, triage_connector_ticket

    try:
        credential = add_actor(conn, "demo-commander", display_name="Demo Commander", created_by="demo")
    except ActorError:  # an earlier demo added it: a fresh credential, never printed
        credential = reissue(conn, "demo-commander", issued_by="demo")
    grant(conn, "demo-commander", project_id, "commander", granted_by="demo")
    commander = authenticate(conn, credential)
    state, version = conn.execute("SELECT triage_state, version FROM tickets WHERE ticket_id = %s",
                                  (ticket_id,)).fetchone()
    if state != "UNTRIAGED":
        return
    set_connector_ticket_priority(conn, commander, client_command_id=f"demo:priority:{ticket_id}", ticket_id=ticket_id,
                                  expected_version=version, priority="P1", reason="demo: first reported defect")
    triage_connector_ticket(conn, commander, client_command_id=f"demo:accept:{ticket_id}", ticket_id=ticket_id,
                            expected_version=version + 1, disposition="ACCEPTED", reason="demo: confirmed")


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
    from nexus_pipelines.cli_common import operator
    from nexus_pipelines.connectors.core.activation import activate
    from nexus_pipelines.connectors.registry import LOCAL_REGISTRATIONS_DIR, REGISTRY, load_registrations
    from nexus_pipelines.control.db import connect
    from nexus_pipelines.local.simulators.gitlab import GitLabState, build_gitlab_app
    from nexus_pipelines.local.simulators.http import serve_in_thread
    from nexus_pipelines.tickets.handlers import route_versions
    from nexus_pipelines.tickets.proofs import record_proof
    from nexus_pipelines.tickets.queries import list_tickets

    state_file = local_dir / "simulators" / "gitlab.json"
    state = GitLabState()
    if not state.load(state_file):
        _seed(state)
    state.add_token(DEMO_TOKEN, DEMO_PROJECT_ID, scopes=("api",))
    os.environ[TOKEN_ENV] = DEMO_TOKEN
    try:
        url, stop = serve_in_thread(build_gitlab_app(state), port=DEMO_PORT)
    except RuntimeError as exc:
        echo(f"error: {exc}; stop whatever uses port {DEMO_PORT} (an earlier demo?) and run make demo again")
        return 1
    echo(f"GitLab simulator on {url} (project {DEMO_PROJECT_ID}, data in {state_file})")
    registration = load_registrations(LOCAL_REGISTRATIONS_DIR)["acme/demo-gitlab"]
    rid = registration.registration_id
    try:
        with connect(dsn) as conn:
            activate(conn, registration, REGISTRY, recorded_by="demo", route_versions=route_versions(),
                     drain_old=lambda *_: _run_jobs(instance, dsn, rid))
        first = _run_jobs(instance, dsn, rid)
        with connect(dsn) as conn:
            after_intake = _counts(conn, rid)
            ticket = list_tickets(conn, registration_id=rid, limit=1)[0]
            _accept_as_demo_commander(conn, ticket.ticket_id, f"{registration.tenant}/{registration.project}")
            proof = record_proof(conn, ticket.ticket_id, evidence="fixed in release 2026.12 (demo)",
                                 recorded_by=operator(), client_request_id="demo:first-ticket")
        _run_jobs(instance, dsn, rid)  # the drain posts the marked comment and closes the issue
        _run_jobs(instance, dsn, rid)  # the poll observes the closed issue: one more observation
        with connect(dsn) as conn:
            after_close = _counts(conn, rid)
        replay = _run_jobs(instance, dsn, rid)
        with connect(dsn) as conn:
            after_replay = _counts(conn, rid)
    finally:
        stop()
        state.save(state_file)
    iid = int(ticket.external_ref.rsplit(":", 1)[1])
    issue = state.issue(DEMO_PROJECT_ID, iid)
    marked = [n for n in issue.notes if f"[nexus:close:{proof.command_id.removeprefix('close-')}]" in n.body]
    p = first["poll"]
    echo("")
    echo("demo-gitlab issue intake summary")
    echo(f"  poll       {p['pages']} pages, {p['issues_seen']} issues seen, {p['admitted']} new versions, "
         f"{p['excluded']} excluded (a task), {p['api_calls']} API calls; {first['drained']} work items applied")
    echo(f"  tickets    {after_intake['tickets']} connector tickets, each UNTRIAGED at P2 "
         "(`nexus-pipelines tickets list`)")
    echo(f"  close-back ticket {ticket.ticket_id} ({ticket.external_ref}) proof {proof.proof_id}"
         f"{'' if proof.created else ' (recorded by an earlier demo)'}: issue #{iid} is {issue.state}, "
         f"{len(marked)} marked comment, {after_close['close receipts']} close receipt")
    unchanged = after_replay == after_close
    echo(f"  replay     poll + route + drain again: {replay['poll']['admitted']} new versions, "
         f"{'nothing changed' if unchanged else 'CHANGED: ' + str(after_replay)}")
    echo(f"  triage     ticket {ticket.ticket_id} accepted by demo-commander at P1; the others wait UNTRIAGED "
         "in Attention")
    echo("  the runs are in the Dagster UI of `make dev` (jobs connectors_poll, workqueue_drain), the tickets on its "
         "pages at http://127.0.0.1:3100 (sign in with a credential from `nexus-pipelines actors add`)")
    ok = unchanged and len(marked) == 1 and issue.state == "closed" and after_close["close receipts"] >= 1
    return 0 if ok else 1
