"""Provider-neutral helpers for connector tests that run on the real control plane:
activate, poll, route and drain one world's registrations exactly as the code location
does, with the world's in-process transport as the only difference."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta

from psycopg import Connection
from psycopg_pool import ConnectionPool

from nexus_pipelines.connectors.core import activation, store
from nexus_pipelines.connectors.core.compose import CachedComposer
from nexus_pipelines.connectors.core.executor import RetryExecutor
from nexus_pipelines.connectors.core.registration import Registration
from nexus_pipelines.connectors.core.registry import ComposeContext
from nexus_pipelines.connectors.core.sweep import SweepReport, sweep
from nexus_pipelines.connectors.core.tick import PollRunReport, poll
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.connectors.sweeps import sources
from nexus_pipelines.local.simulators.http import Fault, TransportFault, to_sim_request
from nexus_pipelines.tickets.handlers import OBSERVATION_ROUTE, TicketHandlers, route_versions
from nexus_pipelines.tickets.proofs import record_proof
from nexus_pipelines.workqueue.handlers import HandlerRegistry
from nexus_pipelines.workqueue.receipts import route_receipts
from nexus_pipelines.workqueue.retry import RetryPolicy
from nexus_pipelines.workqueue.worker import DrainReport, drain
from tests.tickets.support import accept

NO_WAIT = RetryPolicy(base_s=0, cap_s=0, jitter=0)
# The shared suite's transport fault names (tests/connectors/conformance/harness.py) as simulator faults:
# the same for every provider, since the transport fails the same way whoever answers.
TRANSPORT_FAULTS = {
    "timeout": TransportFault.TIMEOUT_BEFORE_APPLY,
    "connect_error": TransportFault.CONNECT_ERROR,
    "read_error": TransportFault.RESET_BEFORE_RESPONSE,
    "protocol_error": TransportFault.PROTOCOL_ERROR,
    "apply_then_timeout": TransportFault.APPLY_THEN_TIMEOUT,
    "apply_then_read_error": TransportFault.APPLY_THEN_RESET,
    "apply_then_protocol_error": TransportFault.APPLY_THEN_DROP,
}



class SimulatorWorld:
    """The half of a conformance `World` that is the same over every simulator: faults queued
    per suite operation, recorded requests named by the simulator's route, the clock.

    A provider's world sets `operations` (suite operation -> simulator operation) and
    `route` (its simulator's static route), defines `fault(name)`, and has `state` (with
    `faults` and `clock`) and `transport` (a `SimulatorTransport`)."""

    operations: Mapping[str, str]
    route: Callable  # (SimRequest) -> (operation, groups)
    fault: Callable[[str], Fault]  # a suite fault name -> the provider's answer

    def fail_next(self, operation: str, fault: str, times: int = 1) -> None:
        self.state.faults.push(self.operations[operation], *[self.fault(fault)] * times)

    def clear_faults(self) -> None:
        self.state.faults.clear()

    def requests(self) -> list[tuple[str, str]]:
        names = {v: k for k, v in self.operations.items()}
        out = []
        for request in self.transport.requests:
            operation, _ = self.route(to_sim_request(request))
            out.append((names.get(operation, operation), request.method))
        return out

    def clear_requests(self) -> None:
        self.transport.requests.clear()

    def advance(self, seconds: float) -> None:
        self.state.clock.advance(seconds)


def executor() -> RetryExecutor:
    return RetryExecutor(sleep=lambda s: None, jitter=lambda: 0.0)


class Plant:
    """One world's provider wired to one control-plane database."""

    def __init__(self, world, pool: ConnectionPool) -> None:
        self.world = world
        self.pool = pool
        self.composer = CachedComposer(REGISTRY, ComposeContext(transport=world.transport), environ=world.environ)
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
        total = 0
        with self.pool.connection() as conn:
            while True:
                report = route_receipts(conn, {OBSERVATION_ROUTE.route_id: OBSERVATION_ROUTE}, owner="test-router",
                                        limit=500)
                total += report.materialized
                if report.claimed == 0:
                    return total

    def drain(self, registration_ids: Sequence[str] | None = None) -> DrainReport:
        return drain(self.pool, self.registry(), registration_ids=list(registration_ids) if registration_ids else None,
                     retry_policy=NO_WAIT, time_budget_s=60, concurrency=2)

    def sync(self, registrations: Sequence[Registration] | None = None) -> PollRunReport:
        """Poll until idle, route, drain: what the sensors make happen."""
        report = self.poll(registrations)
        self.route()
        self.drain([r.registration_id for r in registrations] if registrations else None)
        return report

    def sweep(self, registration: Registration, **kwargs) -> SweepReport:
        """One reconciliation sweep of the registration, as the sweep job runs it."""
        with self.pool.connection() as conn:
            return sweep(conn, REGISTRY, registration, sources(self.composer), owner="test-sweeper",
                         executor=executor(), **kwargs)

    def prove(self, ticket_id: int, request_id: str = "proof-1", evidence: str = "shipped in release 42"):
        """Record a success proof; an open, untriaged connector ticket is first accepted by its project's
        commander, as only an ACCEPTED ticket takes one (phase 3)."""
        with self.pool.connection() as conn:
            if conn.execute("""SELECT 1 FROM tickets t JOIN ticket_custody_links USING (ticket_id)
                                WHERE ticket_id = %s AND t.status = 'open' AND t.triage_state = 'UNTRIAGED'""",
                            (ticket_id,)).fetchone():
                accept(conn, ticket_id)
            return record_proof(conn, ticket_id, evidence=evidence, recorded_by="operator:test",
                                client_request_id=request_id)


def tickets_by_ref(conn: Connection, registration: Registration) -> dict[str, dict]:
    rows = conn.execute(
        """SELECT l.external_ref, t.ticket_id, t.title, t.status, t.triage_state, t.priority, t.version,
                  t.source_state, (SELECT count(*) FROM ticket_observations o WHERE o.ticket_id = t.ticket_id)
             FROM ticket_custody_links l JOIN tickets t USING (ticket_id)
            WHERE l.tenant = %s AND l.registration_key = %s""",
        (registration.tenant, registration.key),
    ).fetchall()
    keys = ("ticket_id", "title", "status", "triage_state", "priority", "version", "source_state", "observations")
    return {r[0]: dict(zip(keys, r[1:])) for r in rows}


def counts(conn: Connection, registration: Registration) -> dict[str, int]:
    """Row counts of every fact a round trip writes, scoped to one registration."""
    rid = registration.registration_id
    params = (registration.tenant, registration.key)
    one = lambda sql, args=params: conn.execute(sql, args).fetchone()[0]  # noqa: E731
    return {
        "tickets": one("SELECT count(*) FROM ticket_custody_links WHERE tenant = %s AND registration_key = %s"),
        "observations": one("""SELECT count(*) FROM ticket_observations o JOIN ticket_custody_links l USING (ticket_id)
                               WHERE l.tenant = %s AND l.registration_key = %s"""),
        "priority_facts": one("""SELECT count(*) FROM ticket_priority_facts f JOIN ticket_custody_links l USING (ticket_id)
                                 WHERE l.tenant = %s AND l.registration_key = %s"""),
        "commands": one("SELECT count(*) FROM ticket_close_commands WHERE tenant = %s AND registration_key = %s"),
        "receipts": one("""SELECT count(*) FROM ticket_close_receipts r JOIN ticket_close_commands c USING (command_id)
                           WHERE c.tenant = %s AND c.registration_key = %s"""),
        "ingress_receipts": one("SELECT count(*) FROM ingress_receipts WHERE registration_id = %s", (rid,)),
        "work_items": one("SELECT count(*) FROM connector_work_items WHERE registration_id = %s", (rid,)),
    }


def all_control_text(conn) -> str:
    """Every text, json and array value of every table in the control schema, as one string."""
    columns = conn.execute(
        """SELECT table_name, column_name FROM information_schema.columns
            WHERE table_schema = current_schema() AND data_type IN ('text', 'jsonb', 'json', 'ARRAY',
                                                                    'character varying')""").fetchall()
    parts = []
    for table, column in columns:
        rows = conn.execute(f'SELECT "{column}"::text FROM "{table}" WHERE "{column}" IS NOT NULL').fetchall()
        parts.extend(r[0] for r in rows)
    return "\n".join(parts)


def everything_recorded(plant: Plant, registration: Registration, reports: Sequence[PollRunReport], log_text: str) -> str:
    """Every text a secret could leak into: logs, the composed adapter's repr, the poll ticks,
    every control-plane table and the registration's cursor tokens, as one string."""
    texts = [log_text, repr(plant.composer(registration))]
    texts += [str(tick.as_dict()) for report in reports for tick in report.ticks]
    with plant.pool.connection() as conn:
        texts.append(all_control_text(conn))
        texts.extend(v.cursor or "" for v in store.progress(conn, [registration.registration_id]))
    return "\n".join(texts)
