"""A unique credential value never appears in logs, control tables, Dagster run config or metadata,
cursor tokens or failure text, through success and failure paths."""

from __future__ import annotations

import logging
import uuid

from dagster import DagsterInstance

from nexus_pipelines import bindings
from nexus_pipelines.connectors.core import activation, store
from nexus_pipelines.connectors.jobs import connectors_poll_job
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.control.resources import ControlPlaneResource
from nexus_pipelines.local.simulators.http import Fault
from nexus_pipelines.tickets.assets import TicketObserver
from nexus_pipelines.tickets.handlers import route_versions
from nexus_pipelines.tickets.proofs import record_proof
from nexus_pipelines.tickets.queries import list_tickets
from nexus_pipelines.workqueue.jobs import build_drain_job, build_router_job
from tests.connectors.served import serve_gitlab
from tests.connectors.support import all_control_text
from nexus_pipelines.local.worlds.plant import accept


def test_the_credential_never_leaves_the_transport(tmp_path, monkeypatch, control_dsn, pool, caplog):
    canary = f"glpat-canary-{uuid.uuid4().hex}"
    caplog.set_level(logging.DEBUG)
    served, stop = serve_gitlab(tmp_path, key="canary", token=canary)
    monkeypatch.setenv(served.token_env, canary)
    rid = served.registration.registration_id
    resources = {"control_plane": ControlPlaneResource(dsn=control_dsn), "ticket_observer": TicketObserver()}
    instance = DagsterInstance.ephemeral()
    texts = []
    try:
        for n in range(4):
            served.state.add_issue(served.registration.provider.project_id, title=f"canary {n}")
        with pool.connection() as conn:
            activation.activate(conn, served.registration, REGISTRY, recorded_by="test",
                                route_versions=route_versions(), drain_old=lambda *_: None)
        poll_config = {"ops": {"connectors_poll_op": {"config": {"registrations": [rid]}}}}
        runs = [connectors_poll_job.execute_in_process(run_config=poll_config, resources=resources, instance=instance)]
        runs.append(build_router_job(bindings.build_route_table).execute_in_process(resources=resources,
                                                                                    instance=instance))
        drain = build_drain_job(bindings.build_handler_registry)
        runs.append(drain.execute_in_process(resources=resources, instance=instance))
        with pool.connection() as conn:
            ticket = list_tickets(conn, registration_id=rid)[0]
            accept(conn, ticket.ticket_id)
            record_proof(conn, ticket.ticket_id, evidence=f"evidence quoting token={canary}", recorded_by="ops",
                         client_request_id="canary")
        served.state.faults.push("create_note", Fault(status=500, body={"message": canary}))
        runs.append(drain.execute_in_process(resources=resources, instance=instance))
        served.state.revoke(canary)  # and a terminal failure
        with pool.connection() as conn:
            store.request_poll(conn, [rid])
        failed = connectors_poll_job.execute_in_process(run_config=poll_config, resources=resources,
                                                        instance=instance, raise_on_error=False)
        runs.append(failed)
        assert not failed.success
        for result in runs:
            for event in instance.all_logs(result.run_id):
                texts.append(str(event))
            texts.append(str(instance.get_run_by_id(result.run_id).run_config))
        with pool.connection() as conn:
            texts.append(all_control_text(conn))
            texts.extend(v.cursor or "" for v in store.progress(conn, [rid]))
    finally:
        stop()
    texts.append(caplog.text)
    haystack = "\n".join(texts)
    assert "canary 0" in haystack  # the scan really reads what was written
    assert canary not in haystack
