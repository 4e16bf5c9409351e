"""The issue-intake part of `make demo`: a GitLab, a GitHub and a Jira registration side by
side, each against its simulator on loopback, through the code location's own Dagster jobs.

1. the sandbox's GitLab, GitHub and Jira simulators (`sandbox.py`) serve a project, a
   repository and a Jira project seeded the first time (with a task, a pull request and a
   sub-task that the connectors skip);
2. activate the `demo-gitlab`, `demo-github` and `demo-jira` registrations
   (configs/connectors/local);
3. per registration, run the poll, receipt-router and drain jobs: issues in, tickets out
   (UNTRIAGED, P2);
4. the demo commander sets the first ticket's priority and accepts it (through the same
   commands as the pages), then one accepted success proof is recorded and drained: one
   marked comment, the issue closed;
5. poll once more (the close-back changed the issue: one observation), then run
   everything again: nothing new is written (custody, digests and the receipt).
"""

from __future__ import annotations

from collections.abc import Callable

from dagster import DagsterInstance

from nexus_pipelines.local.sandbox import Tracker


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
    from nexus_pipelines.tickets.assets import TicketObserver
    from nexus_pipelines.workqueue.jobs import build_drain_job, build_router_job

    with connect(dsn) as conn:
        store.request_poll(conn, [registration_id])  # poll now, whatever the schedule says
    resources = {"control_plane": ControlPlaneResource(dsn=dsn), "ticket_observer": TicketObserver()}
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


def run_connector_demo(echo: Callable[[str], None], *, dsn: str, trackers: list[Tracker],
                       instance: DagsterInstance) -> int:
    """Each tracker's registration through intake, triage, close-back and replay."""
    from nexus_pipelines.connectors.registry import LOCAL_REGISTRATIONS_DIR, load_registrations

    registrations = load_registrations(LOCAL_REGISTRATIONS_DIR)
    ok = [_run_registration(echo, tracker, registrations[tracker.registration_id], dsn=dsn, instance=instance)
          for tracker in trackers]
    echo("  the runs are in the Dagster UI of `make dev` (jobs connectors_poll, workqueue_drain), the tickets on its "
         "pages at http://127.0.0.1:3100 (sign in with a credential from `nexus-pipelines actors add`)")
    return 0 if all(ok) else 1


def _run_registration(echo: Callable[[str], None], tracker: Tracker, registration, *, dsn: str,
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
    state, comments = tracker.issue(ticket.external_ref)
    marked = [c for c in comments if f"[nexus:close:{proof.command_id.removeprefix('close-')}]" in c]
    p = first["poll"]
    echo("")
    echo(f"{registration.key} issue intake summary")
    echo(f"  poll       {p['pages']} pages, {p['issues_seen']} issues seen, {p['admitted']} new versions, "
         f"{p['excluded']} excluded ({tracker.skipped}), {p['api_calls']} API calls; {first['drained']} work items "
         "applied")
    echo(f"  tickets    {after_intake['tickets']} connector tickets, each created UNTRIAGED at P2 "
         "(`nexus-pipelines tickets list`)")
    echo(f"  close-back ticket {ticket.ticket_id} ({ticket.external_ref}) proof {proof.proof_id}"
         f"{'' if proof.created else ' (recorded by an earlier demo)'}: the issue is {state}, "
         f"{len(marked)} marked comment, {after_close['close receipts']} close receipt")
    unchanged = after_replay == after_close
    echo(f"  replay     poll + route + drain again: {replay['poll']['admitted']} new versions, "
         f"{'nothing changed' if unchanged else 'CHANGED: ' + str(after_replay)}")
    echo(f"  triage     ticket {ticket.ticket_id} accepted by demo-commander at P1 before its proof; the others wait "
         "UNTRIAGED in Attention")
    return unchanged and len(marked) == 1 and state == "closed" and after_close["close receipts"] >= 1
