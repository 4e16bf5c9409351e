"""Read models of tickets for the CLI, the Dagster observations and Ticket Detail."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import Connection
from psycopg.rows import dict_row


@dataclass(frozen=True)
class TicketCounts:
    total: int
    untriaged: int
    open: int
    closed: int  # closed at the source by a close-back receipt


def counts_by_registration(conn: Connection) -> dict[str, TicketCounts]:
    rows = conn.execute(
        """SELECT l.tenant || '/' || l.registration_key, count(*),
                  count(*) FILTER (WHERE t.triage_state = 'UNTRIAGED'), count(*) FILTER (WHERE t.status = 'open'),
                  count(r.command_id)
             FROM ticket_custody_links l JOIN tickets t USING (ticket_id)
             LEFT JOIN ticket_close_receipts r ON r.ticket_id = t.ticket_id
            GROUP BY 1"""
    ).fetchall()
    return {row[0]: TicketCounts(*row[1:]) for row in rows}


def linked_refs(conn: Connection, refs: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which (registration id, external ref) pairs already have a ticket."""
    if not refs:
        return set()
    rows = conn.execute(
        """SELECT l.tenant || '/' || l.registration_key, l.external_ref
             FROM ticket_custody_links l
             JOIN unnest(%s::text[], %s::text[]) AS r(registration_id, external_ref)
               ON l.tenant || '/' || l.registration_key = r.registration_id AND l.external_ref = r.external_ref""",
        ([r for r, _ in refs], [e for _, e in refs]),
    ).fetchall()
    return {(row[0], row[1]) for row in rows}


@dataclass(frozen=True)
class WaitingFindings:
    unresolved: int
    oldest_age_s: int  # of the oldest unresolved finding, by the database clock


def waiting_findings_by_registration(conn: Connection) -> dict[str, WaitingFindings]:
    """Unresolved Attention findings of each registration's tickets (registrations with none are absent)."""
    rows = conn.execute(
        """SELECT l.tenant || '/' || l.registration_key, count(*),
                  extract(epoch FROM clock_timestamp() - min(f.opened_at))::bigint
             FROM attention_findings f JOIN ticket_custody_links l USING (ticket_id)
            WHERE NOT EXISTS (SELECT 1 FROM attention_resolutions r WHERE r.finding_id = f.finding_id)
            GROUP BY 1"""
    ).fetchall()
    return {row[0]: WaitingFindings(row[1], row[2]) for row in rows}


@dataclass(frozen=True)
class TicketRow:
    ticket_id: int
    registration_id: str
    external_ref: str
    title: str
    status: str
    triage_state: str
    priority: str
    source_state: str
    updated_at: datetime
    closed_at_source: bool


def list_tickets(conn: Connection, *, registration_id: str | None = None, status: str | None = None,
                 triage_state: str | None = None, limit: int = 50, after_id: int = 0) -> list[TicketRow]:
    rows = conn.execute(
        """SELECT t.ticket_id, l.tenant || '/' || l.registration_key, l.external_ref, t.title, t.status,
                  t.triage_state, t.priority, t.source_state, t.updated_at,
                  EXISTS (SELECT 1 FROM ticket_close_receipts r WHERE r.ticket_id = t.ticket_id)
             FROM tickets t JOIN ticket_custody_links l USING (ticket_id)
            WHERE t.ticket_id > %(after)s
              AND (%(reg)s::text IS NULL OR l.tenant || '/' || l.registration_key = %(reg)s)
              AND (%(status)s::text IS NULL OR t.status = %(status)s)
              AND (%(triage)s::text IS NULL OR t.triage_state = %(triage)s)
            ORDER BY t.ticket_id LIMIT %(limit)s""",
        {"after": after_id, "reg": registration_id, "status": status, "triage": triage_state, "limit": limit},
    ).fetchall()
    return [TicketRow(*row) for row in rows]


def ticket_detail(conn: Connection, ticket_id: int) -> dict[str, Any] | None:
    """One ticket with its custody, age, Attention findings, relations, attributed facts (and
    `trail`, the priority and triage facts in time order), proofs and close commands."""
    with conn.cursor(row_factory=dict_row) as cur:
        ticket = cur.execute(
            """SELECT t.*, l.tenant || '/' || l.registration_key AS registration_id, l.external_ref, l.display_url,
                      l.connector_kind, extract(epoch FROM clock_timestamp() - t.created_at)::bigint AS age_s
                 FROM tickets t LEFT JOIN ticket_custody_links l USING (ticket_id) WHERE t.ticket_id = %s""",
            (ticket_id,),
        ).fetchone()
        if ticket is None:
            return None
        ticket["findings"] = cur.execute(
            """SELECT f.finding_id, f.kind, f.owner_role, f.opened_at,
                      extract(epoch FROM clock_timestamp() - f.opened_at)::bigint AS age_s, r.disposition, r.resolved_at
                 FROM attention_findings f LEFT JOIN attention_resolutions r USING (finding_id)
                WHERE f.ticket_id = %s ORDER BY f.finding_id""", (ticket_id,)).fetchall()
        ticket["relations"] = cur.execute(
            """SELECT relation, related_ticket_id AS ticket_id, 'outgoing' AS direction FROM ticket_relations
                WHERE ticket_id = %(id)s
               UNION ALL
               SELECT relation, ticket_id, 'incoming' FROM ticket_relations WHERE related_ticket_id = %(id)s
               ORDER BY 3, 2""", {"id": ticket_id}).fetchall()
        ticket["observations"] = cur.execute(
            """SELECT observation_id, source_updated_at, source_digest, observed_at FROM ticket_observations
                WHERE ticket_id = %s ORDER BY observation_id""", (ticket_id,)).fetchall()
        ticket["priority_facts"] = cur.execute(
            "SELECT 'priority' AS kind, priority AS value, prior_priority AS prior, actor, actor_role, reason,"
            " recorded_at, fact_id FROM ticket_priority_facts WHERE ticket_id = %s ORDER BY fact_id",
            (ticket_id,)).fetchall()
        ticket["triage_facts"] = cur.execute(
            "SELECT 'triage' AS kind, triage_state AS value, NULL AS prior, actor, actor_role, reason, recorded_at, fact_id"
            " FROM ticket_triage_facts WHERE ticket_id = %s ORDER BY fact_id", (ticket_id,)).fetchall()
        ticket["proofs"] = cur.execute(
            "SELECT proof_id, evidence, recorded_by, recorded_at FROM ticket_proofs WHERE ticket_id = %s"
            " ORDER BY proof_id", (ticket_id,)).fetchall()
        ticket["close_commands"] = cur.execute(
            """SELECT c.command_id, c.status, c.dispatches, c.last_result, c.last_detail, r.comment_ref,
                      r.recorded_at AS receipt_at
                 FROM ticket_close_commands c LEFT JOIN ticket_close_receipts r USING (command_id)
                WHERE c.ticket_id = %s ORDER BY c.created_at""", (ticket_id,)).fetchall()
    ticket["trail"] = sorted(ticket["priority_facts"] + ticket["triage_facts"],
                             key=lambda f: (f["recorded_at"], f["kind"] == "triage"))
    return ticket
