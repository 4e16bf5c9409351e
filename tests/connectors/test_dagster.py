"""The connectors' Dagster wiring: the poll job over real HTTP, the poll sensor, the proof job,
ticket observations, and the drain of the code location running the ticket work types."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance, SkipReason, build_sensor_context

from nexus_pipelines import bindings
from nexus_pipelines.connectors.core import activation, store
from nexus_pipelines.connectors.jobs import POLL_TAG, connectors_poll_job
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.connectors.sensors import connectors_poll_sensor, poll_requests
from nexus_pipelines.control.resources import ControlPlaneResource
from nexus_pipelines.tickets.assets import TicketObserver, tickets_asset_key
from nexus_pipelines.tickets.handlers import route_versions
from nexus_pipelines.tickets.jobs import record_proof_job, tickets_observe_job
from nexus_pipelines.tickets.queries import list_tickets
from nexus_pipelines.workqueue.jobs import build_drain_job, build_router_job
from tests.connectors.served import serve_gitlab
from nexus_pipelines.local.worlds.plant import accept
from nexus_pipelines.local.worlds.tokens import gitlab_token

TOKEN = gitlab_token("dagster-test-0123456789abcdef")


@pytest.fixture
def served(tmp_path, monkeypatch, request):
    gitlab, stop = serve_gitlab(tmp_path, key=f"dagster-{abs(hash(request.node.name)) % 10**6}", token=TOKEN)
    monkeypatch.setenv(gitlab.token_env, TOKEN)
    yield gitlab
    stop()


def run(job, control_dsn, instance, config=None, **kw):
    return job.execute_in_process(run_config=config or {}, instance=instance,
                                  resources={"control_plane": ControlPlaneResource(dsn=control_dsn),
                                             "ticket_observer": TicketObserver()}, **kw)


def test_poll_route_drain_and_prove_through_the_dagster_jobs(served, control_dsn, pool):
    for n in range(3):
        served.state.add_issue(served.registration.provider.project_id, title=f"served {n}")
    rid = served.registration.registration_id
    with pool.connection() as conn:
        activation.activate(conn, served.registration, REGISTRY, recorded_by="test", route_versions=route_versions(),
                            drain_old=lambda *_: None)
    instance = DagsterInstance.ephemeral()
    polled = run(connectors_poll_job, control_dsn, instance,
                 {"ops": {"connectors_poll_op": {"config": {"registrations": [rid]}}}})
    assert polled.success and polled.dagster_run.tags[POLL_TAG] == "poll"
    totals = polled.output_for_node("connectors_poll_op")["totals"]
    assert (totals["pages"], totals["issues_seen"], totals["admitted"], totals["api_calls"]) == (1, 3, 3, 1)
    assert (totals["new_tickets"], totals["ticket_updates"]) == (3, 0)
    materialization = polled.get_step_success_events()[0].step_success_data  # the op finished
    assert materialization is not None
    observation = [e for e in polled.all_events if e.event_type_value == "ASSET_OBSERVATION"][0]
    assert observation.asset_key == tickets_asset_key(rid)
    run(build_router_job(bindings.build_route_table), control_dsn, instance)
    drained = run(build_drain_job(bindings.build_handler_registry), control_dsn, instance,
                  {"ops": {"workqueue_drain_op": {"config": {"registration_ids": [rid]}}}})
    assert drained.output_for_node("workqueue_drain_op")["completed"] == 3
    with pool.connection() as conn:
        ticket = list_tickets(conn, registration_id=rid)[0]
        accept(conn, ticket.ticket_id)  # only an ACCEPTED ticket takes a proof
    proved = run(record_proof_job, control_dsn, instance, {"ops": {"record_proof_op": {"config": {
        "ticket_id": ticket.ticket_id, "evidence": "released", "recorded_by": "ops"}}}})
    assert proved.success
    run(build_drain_job(bindings.build_handler_registry), control_dsn, instance,
        {"ops": {"workqueue_drain_op": {"config": {"registration_ids": [rid]}}}})
    iid = int(ticket.external_ref.rsplit(":", 1)[1])
    assert served.state.issue(served.registration.provider.project_id, iid).state == "closed"
    refused = run(record_proof_job, control_dsn, instance, {"ops": {"record_proof_op": {"config": {
        "ticket_id": ticket.ticket_id, "evidence": "again", "recorded_by": "ops"}}}}, raise_on_error=False)
    assert not refused.success
    failure = next(e for e in refused.all_events if e.is_step_failure)
    assert "already has accepted success proof" in failure.step_failure_data.user_failure_data.description
    with pool.connection() as conn:
        store.request_poll(conn, [rid])
    repolled = run(connectors_poll_job, control_dsn, instance,
                   {"ops": {"connectors_poll_op": {"config": {"registrations": [rid]}}}})
    totals = repolled.output_for_node("connectors_poll_op")["totals"]
    assert (totals["new_tickets"], totals["ticket_updates"]) == (0, 1)  # the closed issue, observed once
    observed = run(tickets_observe_job, control_dsn, instance)
    assert any(e.asset_key == tickets_asset_key(rid) for e in observed.all_events
               if e.event_type_value == "ASSET_OBSERVATION")


def test_a_terminal_poll_failure_fails_the_run_with_one_line(served, control_dsn, pool):
    rid = served.registration.registration_id
    with pool.connection() as conn:
        activation.activate(conn, served.registration, REGISTRY, recorded_by="test", route_versions=route_versions(),
                            drain_old=lambda *_: None)
        store.request_poll(conn, [rid])
    served.state.revoke(TOKEN)
    result = run(connectors_poll_job, control_dsn, DagsterInstance.ephemeral(),
                 {"ops": {"connectors_poll_op": {"config": {"registrations": [rid]}}}}, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    description = failure.step_failure_data.user_failure_data.description
    assert "authentication" in description and "\n" not in description and TOKEN not in description


def test_the_poll_sensor_requests_one_run_per_due_registration_and_skips_busy_ones(served, pool, control_dsn):
    due = [("acme/a", "a@1", 1), ("acme/b", "b@1", 1)]
    requests = poll_requests(due, busy={"acme/b"}, bucket=7)
    assert [r.run_key for r in requests] == ["connectors_poll:acme/a:a@1:7"]
    assert requests[0].tags == {POLL_TAG: "acme/a"}
    assert requests[0].run_config == {"ops": {"connectors_poll_op": {"config": {"registrations": ["acme/a"]}}}}
    rid = served.registration.registration_id
    with pool.connection() as conn:
        conn.execute("UPDATE connector_progress SET next_poll_at = now() + interval '1 hour'")
        activation.activate(conn, served.registration, REGISTRY, recorded_by="test", route_versions=route_versions(),
                            drain_old=lambda *_: None)
        store.request_poll(conn, [rid])
    resources = {"control_plane": ControlPlaneResource(dsn=control_dsn)}
    with build_sensor_context(instance=DagsterInstance.ephemeral(), resources=resources) as context:
        result = connectors_poll_sensor(context)
    assert [r.tags[POLL_TAG] for r in result] == [rid]
    with pool.connection() as conn:
        conn.execute("UPDATE connector_progress SET next_poll_at = now() + interval '1 hour'")
    with build_sensor_context(instance=DagsterInstance.ephemeral(), resources=resources) as context:
        assert isinstance(connectors_poll_sensor(context), SkipReason)
