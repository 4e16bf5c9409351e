"""Helpers for triage tests: tickets ingested through a plant, and one ticket command each
by an actor authenticated the way every caller is (`member` in
nexus_pipelines/local/worlds/plant.py)."""

from __future__ import annotations

import uuid

from psycopg import Connection

from nexus_pipelines.actors.store import Principal
from nexus_pipelines.connectors.core.sweep import SweepBounds
from nexus_pipelines.tickets.commands import (
    acknowledge_sweep_gap,
    set_connector_ticket_priority,
    triage_connector_ticket,
)


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


def acknowledge(conn: Connection, principal: Principal, ticket_id: int, through_finding_id: int,
                reason: str = "scan fixed; nothing else missed"):
    return acknowledge_sweep_gap(conn, principal, client_command_id=uuid.uuid4().hex, ticket_id=ticket_id,
                                 expected_version=version(conn, ticket_id), through_finding_id=through_finding_id,
                                 reason=reason)


def sweep_gap(plant, registration, ticket_id: int, *, renamed: str | None = None) -> int:
    """Make the ticket's newest version a gap a sweep finds, sweep, route and drain; returns the
    gap's finding id. The gap is the newest observation lost (as only a restore from an old
    backup could lose it) or, with `renamed`, a new version at the provider no poll has read."""
    with plant.pool.connection() as conn, conn.transaction():
        if renamed is not None:
            (ref,) = conn.execute("SELECT external_ref FROM ticket_custody_links WHERE ticket_id = %s",
                                  (ticket_id,)).fetchone()
            plant.world.update_issue(ref, title=renamed)
        else:
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute("""DELETE FROM ticket_observations WHERE observation_id =
                            (SELECT max(observation_id) FROM ticket_observations WHERE ticket_id = %s)""",
                         (ticket_id,))
    report = plant.sweep(registration, bounds=SweepBounds(settle_s=0))
    assert len(report.reobserved) == 1, report
    plant.route()
    plant.drain([registration.registration_id])
    with plant.pool.connection() as conn:
        return conn.execute("""SELECT max(finding_id) FROM attention_findings
                               WHERE ticket_id = %s AND kind = 'connector_sweep_gap'""", (ticket_id,)).fetchone()[0]
