"""Helpers for triage tests: tickets ingested through a plant, and one ticket command each
by an actor authenticated the way every caller is (`member` in
nexus_pipelines/local/worlds/plant.py)."""

from __future__ import annotations

import uuid

from psycopg import Connection

from nexus_pipelines.actors.store import Principal
from nexus_pipelines.tickets.commands import set_connector_ticket_priority, triage_connector_ticket


def ingest(plant, project: str, issues: int, *, key: str | None = None):
    """Register a project's connector on the plant's world, add issues and run intake as the code location
    does; returns the registration and its ticket ids in creation order."""
    registration = plant.world.registration(key=key or f"tri-{uuid.uuid4().hex[:8]}", project=project)
    plant.activate(registration)
    plant.world.add_issues(issues)
    plant.sync([registration])
    with plant.pool.connection() as conn:
        ids = [r[0] for r in conn.execute(
            "SELECT ticket_id FROM ticket_custody_links WHERE tenant = %s AND registration_key = %s"
            " ORDER BY ticket_id", (registration.tenant, registration.key))]
    return registration, ids


def version(conn: Connection, ticket_id: int) -> int:
    return conn.execute("SELECT version FROM tickets WHERE ticket_id = %s", (ticket_id,)).fetchone()[0]


def set_priority(conn: Connection, principal: Principal, ticket_id: int, priority: str = "P1",
                 reason: str = "customer impact", command_id: str | None = None):
    return set_connector_ticket_priority(conn, principal, client_command_id=command_id or uuid.uuid4().hex,
                                         ticket_id=ticket_id, expected_version=version(conn, ticket_id),
                                         priority=priority, reason=reason)


def triage(conn: Connection, principal: Principal, ticket_id: int, disposition: str = "ACCEPTED",
           reason: str = "real defect", canonical: int | None = None, command_id: str | None = None):
    return triage_connector_ticket(conn, principal, client_command_id=command_id or uuid.uuid4().hex,
                                   ticket_id=ticket_id, expected_version=version(conn, ticket_id),
                                   disposition=disposition, canonical_ticket_id=canonical, reason=reason)
