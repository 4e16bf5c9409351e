"""Read models of the pages (docs/design/triage-authority.md, "Pages"): the Board (tickets
by lifecycle state with a triage filter and each project's counts) and Attention (unresolved findings, oldest first);
Ticket Detail reads `queries.ticket_detail`. They read only the projection and the facts; ages come from the
database clock. A scope is the projects the reader is a member of.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import Connection

from nexus_pipelines.actors.store import Membership

LANES = ("open", "done", "cancelled")
LANE_LIMIT = 200

_IN_SCOPE = "(t.tenant, t.project) IN (SELECT * FROM unnest(%(tenants)s::text[], %(projects)s::text[]))"
_AGE = "extract(epoch FROM clock_timestamp() - {})::bigint"


def _scope(memberships: list[Membership]) -> dict[str, list[str]]:
    return {"tenants": [m.tenant for m in memberships], "projects": [m.project for m in memberships]}


@dataclass(frozen=True)
class ProjectCounts:
    project_id: str
    role: str
    total: int
    untriaged: int
    open: int
    done: int
    cancelled: int
    attention: int  # unresolved findings
    oldest_finding_age_s: int | None


def project_counts(conn: Connection, memberships: list[Membership]) -> list[ProjectCounts]:
    rows = conn.execute(
        f"""SELECT m.tenant, m.project,
                   count(t.ticket_id), count(*) FILTER (WHERE t.triage_state = 'UNTRIAGED'),
                   count(*) FILTER (WHERE t.status = 'open'), count(*) FILTER (WHERE t.status = 'done'),
                   count(*) FILTER (WHERE t.status = 'cancelled'),
                   (SELECT count(*) FROM attention_findings f WHERE f.tenant = m.tenant AND f.project = m.project
                       AND NOT EXISTS (SELECT 1 FROM attention_resolutions r WHERE r.finding_id = f.finding_id)),
                   (SELECT {_AGE.format('min(f.opened_at)')} FROM attention_findings f
                     WHERE f.tenant = m.tenant AND f.project = m.project
                       AND NOT EXISTS (SELECT 1 FROM attention_resolutions r WHERE r.finding_id = f.finding_id))
              FROM unnest(%(tenants)s::text[], %(projects)s::text[]) AS m (tenant, project)
              LEFT JOIN tickets t ON t.tenant = m.tenant AND t.project = m.project
                   AND EXISTS (SELECT 1 FROM ticket_custody_links l WHERE l.ticket_id = t.ticket_id)
             GROUP BY m.tenant, m.project ORDER BY m.tenant, m.project""",
        _scope(memberships)).fetchall()
    roles = {(m.tenant, m.project): m.role for m in memberships}
    return [ProjectCounts(f"{r[0]}/{r[1]}", roles[(r[0], r[1])], *r[2:]) for r in rows]


@dataclass(frozen=True)
class Card:
    ticket_id: int
    project_id: str
    title: str
    status: str
    triage_state: str
    priority: str
    external_ref: str
    age_s: int


@dataclass
class Lane:
    """The first LANE_LIMIT cards of one lifecycle state, and how many the state holds
    (the page says when it shows fewer: no hidden queue)."""

    cards: list[Card]
    total: int = 0


def board_lanes(conn: Connection, memberships: list[Membership], *, triage: str | None = None) -> dict[str, Lane]:
    """Tickets of the scope by lifecycle state, highest priority then oldest first."""
    rows = conn.execute(
        f"""SELECT * FROM (
                SELECT t.ticket_id, t.tenant || '/' || t.project, t.title, t.status, t.triage_state, t.priority,
                       l.external_ref, {_AGE.format('t.created_at')},
                       row_number() OVER (PARTITION BY t.status ORDER BY t.priority, t.created_at, t.ticket_id) AS n,
                       count(*) OVER (PARTITION BY t.status) AS total
                  FROM tickets t JOIN ticket_custody_links l USING (ticket_id)
                 WHERE {_IN_SCOPE} AND (%(triage)s::text IS NULL OR t.triage_state = %(triage)s)) ranked
             WHERE n <= %(limit)s ORDER BY n""",
        {**_scope(memberships), "triage": triage, "limit": LANE_LIMIT}).fetchall()
    lanes = {lane: Lane([]) for lane in LANES}
    for row in rows:
        lane = lanes[row[3]]
        lane.cards.append(Card(*row[:-2]))
        lane.total = row[-1]
    return lanes


# What each finding means and what resolves it, as the pages say it.
FINDING_MEANING = {
    "connector_triage_required": "a new connector ticket waits for triage",
    "connector_sweep_gap": "the incremental scans missed this version; the reconciliation sweep found and "
                           "re-observed it",
}


def resolved_by(kind: str, triage_state: str) -> str:
    if kind == "connector_triage_required":
        return "the commander's triage"
    if triage_state == "UNTRIAGED":
        return "the commander's triage or acknowledgement"
    return "the commander's acknowledgement"


@dataclass(frozen=True)
class AttentionItem:
    finding_id: int
    kind: str
    owner_role: str
    project_id: str
    ticket_id: int
    title: str
    triage_state: str
    priority: str
    status: str
    opened_at: Any
    age_s: int

    @property
    def meaning(self) -> str:
        return FINDING_MEANING[self.kind]

    @property
    def resolved_by(self) -> str:
        return resolved_by(self.kind, self.triage_state)


def attention_items(conn: Connection, memberships: list[Membership]) -> list[AttentionItem]:
    rows = conn.execute(
        f"""SELECT f.finding_id, f.kind, f.owner_role, f.tenant || '/' || f.project, t.ticket_id, t.title,
                   t.triage_state, t.priority, t.status, f.opened_at, {_AGE.format('f.opened_at')}
              FROM attention_findings f JOIN tickets t USING (ticket_id)
             WHERE {_IN_SCOPE}
               AND NOT EXISTS (SELECT 1 FROM attention_resolutions r WHERE r.finding_id = f.finding_id)
             ORDER BY f.opened_at, f.finding_id""",
        _scope(memberships)).fetchall()
    return [AttentionItem(*row) for row in rows]
