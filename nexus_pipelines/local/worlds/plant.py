"""A provider world's registrations run through the code location's own activation, poll,
receipt routing and drain on a real control plane, with the world's in-process transport
as the only difference; and the project commander who accepts a ticket as a person would."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence
from datetime import timedelta

from psycopg import Connection
from psycopg_pool import ConnectionPool

from nexus_pipelines.actors.store import Principal, add_actor, authenticate, grant
from nexus_pipelines.connectors.core import activation, store
from nexus_pipelines.connectors.core.compose import CachedComposer
from nexus_pipelines.connectors.core.executor import RetryExecutor
from nexus_pipelines.connectors.core.registration import Registration
from nexus_pipelines.connectors.core.registry import ComposeContext
from nexus_pipelines.connectors.core.tick import PollRunReport, poll
from nexus_pipelines.connectors.core.sweep import SweepReport, sweep
from nexus_pipelines.connectors.provider_gate import ProviderGates
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.connectors.sweeps import sources
from nexus_pipelines.tickets.commands import set_connector_ticket_priority, triage_connector_ticket
from nexus_pipelines.tickets.handlers import OBSERVATION_ROUTE, TicketHandlers, route_versions
from nexus_pipelines.tickets.proofs import record_proof
from nexus_pipelines.workqueue.handlers import HandlerRegistry
from nexus_pipelines.workqueue.receipts import route_until_idle
from nexus_pipelines.workqueue.retry import RetryPolicy
from nexus_pipelines.workqueue.worker import DrainReport, drain

NO_WAIT = RetryPolicy(base_s=0, cap_s=0, jitter=0)
_names = itertools.count(1)


def executor() -> RetryExecutor:
    return RetryExecutor(sleep=lambda s: None, jitter=lambda: 0.0)


def member(conn: Connection, project_id: str, role: str | None, name: str | None = None) -> tuple[Principal, str]:
    """A new actor with `role` on the project (no role when None): its principal and credential."""
    actor_id = name or f"{role or 'nobody'}-{next(_names)}-{uuid.uuid4().hex[:6]}"
    credential = add_actor(conn, actor_id, display_name=actor_id.title(), created_by="test")
    if role:
        grant(conn, actor_id, project_id, role, granted_by="test")
    return authenticate(conn, credential), credential


def accept(conn: Connection, ticket_id: int) -> None:
    """The ticket's project commander sets its priority and accepts it (what a person does on the page)."""
    tenant, project = conn.execute("SELECT tenant, project FROM tickets WHERE ticket_id = %s", (ticket_id,)).fetchone()
    commander, _ = member(conn, f"{tenant}/{project}", "commander")
    (version,) = conn.execute("SELECT version FROM tickets WHERE ticket_id = %s", (ticket_id,)).fetchone()
    set_connector_ticket_priority(conn, commander, client_command_id=uuid.uuid4().hex, ticket_id=ticket_id,
                                  expected_version=version, priority="P1", reason="customer impact")
    triage_connector_ticket(conn, commander, client_command_id=uuid.uuid4().hex, ticket_id=ticket_id,
                            expected_version=version + 1, disposition="ACCEPTED", reason="real defect")


class Plant:
    """One world's provider wired to one control-plane database."""

    def __init__(self, world, pool: ConnectionPool) -> None:
        self.world = world
        self.pool = pool
        with pool.connection() as conn:
            conn.execute("DELETE FROM provider_gates")  # a new world is a provider no limit holds yet
        self.composer = CachedComposer(REGISTRY, ComposeContext(transport=world.transport, gates=ProviderGates(pool)),
                                       environ=world.environ)
        self.handlers = TicketHandlers(pool, REGISTRY, self.composer, executor_factory=executor)

    def registry(self) -> HandlerRegistry:
        return HandlerRegistry(self.handlers.as_dict())

    def activate(self, registration: Registration) -> activation.ActivationResult:
        with self.pool.connection() as conn:
            return activation.activate(conn, registration, REGISTRY, recorded_by="test",
                                       route_versions=route_versions(), drain_old=self._drain_generation)

    def _drain_generation(self, registration_id: str, revision_no: int) -> None:
        self.route()
        self.drain([registration_id])

    def poll(self, registrations: Sequence[Registration] | None = None, *, max_ticks: int = 1000,
             owner: str = "test-poller", lease_ttl: timedelta = timedelta(seconds=60)) -> PollRunReport:
        ids = [r.registration_id for r in registrations] if registrations else None
        with self.pool.connection() as conn:
            store.request_poll(conn, ids)
            return poll(conn, REGISTRY, self.composer, owner=owner, executor=executor(), registration_ids=ids,
                        max_ticks=max_ticks, lease_ttl=lease_ttl)

    def route(self) -> int:
        return route_until_idle(self.pool, {OBSERVATION_ROUTE.route_id: OBSERVATION_ROUTE},
                                owner="test-router").materialized

    def drain(self, registration_ids: Sequence[str] | None = None) -> DrainReport:
        return drain(self.pool, self.registry(), registration_ids=list(registration_ids) if registration_ids else None,
                     retry_policy=NO_WAIT, time_budget_s=60, concurrency=2)

    def sweep(self, registration: Registration, **kwargs) -> SweepReport:
        """One reconciliation sweep of the registration, as the sweep job runs it."""
        with self.pool.connection() as conn:
            return sweep(conn, REGISTRY, registration, sources(self.composer), owner="test-sweeper",
                         executor=executor(), **kwargs)

    def sync(self, registrations: Sequence[Registration] | None = None) -> PollRunReport:
        """Poll until idle, route, drain: what the sensors make happen."""
        report = self.poll(registrations)
        self.route()
        self.drain([r.registration_id for r in registrations] if registrations else None)
        return report

    def prove(self, ticket_id: int, request_id: str = "proof-1", evidence: str = "shipped in release 42"):
        """Record a success proof; an open, untriaged connector ticket is first accepted by its project's
        commander, as only an ACCEPTED ticket takes one."""
        with self.pool.connection() as conn:
            if conn.execute("""SELECT 1 FROM tickets t JOIN ticket_custody_links USING (ticket_id)
                                WHERE ticket_id = %s AND t.status = 'open' AND t.triage_state = 'UNTRIAGED'""",
                            (ticket_id,)).fetchone():
                accept(conn, ticket_id)
            return record_proof(conn, ticket_id, evidence=evidence, recorded_by="operator:test",
                                client_request_id=request_id)
