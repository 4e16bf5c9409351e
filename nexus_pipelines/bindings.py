"""The code location's bindings of the work queue: which work types, receipt routes and
queue classes exist, and the handlers that run them.

This is the one place that joins the queue with the domains that give it work, so
`workqueue/` never imports them. `definitions.py` and the CLI both build from here.
Today the connectors give the queue its work: `ticket.observe` (routed from the poll's
ingress receipts) and `issue.close` (created with an accepted success proof).
"""

from __future__ import annotations

from psycopg_pool import ConnectionPool

from nexus_pipelines.connectors.core.compose import CachedComposer
from nexus_pipelines.connectors.core.registry import ComposeContext
from nexus_pipelines.connectors.provider_gate import ProviderGates
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.tickets.handlers import OBSERVATION_ROUTE, TicketHandlers
from nexus_pipelines.workqueue.handlers import HandlerRegistry
from nexus_pipelines.workqueue.receipts import Route

QUEUE_CLASSES: tuple[str, ...] = ("default",)


def build_handler_registry(pool: ConnectionPool) -> HandlerRegistry:
    composer = CachedComposer(REGISTRY, ComposeContext(gates=ProviderGates(pool)))
    return HandlerRegistry(TicketHandlers(pool, REGISTRY, composer).as_dict())


def build_route_table() -> dict[str, Route]:
    return {OBSERVATION_ROUTE.route_id: OBSERVATION_ROUTE}


def route_versions() -> dict[str, int]:
    """The routes (and versions) the code location's generations bind at activation."""
    from nexus_pipelines.tickets.handlers import route_versions as ticket_routes

    return ticket_routes()


def ticket_counts(conn) -> dict:
    """Ticket counts by registration id, for `connectors status` (connectors never import tickets)."""
    from nexus_pipelines.tickets.queries import counts_by_registration

    return counts_by_registration(conn)


def known_generations(conn) -> list[tuple[str, int]]:
    """(registration id, revision) of every registered connector revision: the generations
    the operator commands of the queue may name."""
    return [tuple(row) for row in conn.execute(
        "SELECT tenant || '/' || registration_key, revision_no FROM connector_registrations ORDER BY 1, 2")]
