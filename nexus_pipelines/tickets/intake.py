"""Applying one observed issue version to tickets: exact custody and replay-safe
observations (docs/design/connector-contract.md, "Custody and observations").

The first observation of an external reference creates exactly one ticket, its custody
link, the automatic P2 priority fact, the UNTRIAGED triage fact, the unresolved
commander-owned `connector_triage_required` Attention finding and the observation, in
one transaction. An unchanged replay writes nothing (the observation is unique by
source digest); a new digest appends one observation and makes one deterministic
ticket update, unless it is older than a version already observed (then only the
observation is kept). Provider content is external and untrusted: it can change
title, description, labels and the recorded source state, never the ticket's
lifecycle, triage, priority or close eligibility.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import Connection
from psycopg.types.json import Jsonb

from nexus_pipelines.connectors.core.values import ExternalIssue

INTAKE_ACTOR = "system:intake"
DEFAULT_PRIORITY = "P2"


@dataclass(frozen=True)
class CustodyKey:
    tenant: str
    registration_key: str
    external_ref: str


class CustodyConflict(RuntimeError):
    """A custody fact would merge or move a link; closed-world custody refuses it."""


@dataclass(frozen=True)
class IntakeResult:
    outcome: str  # created | updated | unchanged | stale
    ticket_id: int


def apply_observation(
    conn: Connection,
    key: CustodyKey,
    *,
    project: str,
    issue: ExternalIssue,
    digest: str,
    labels: list[str],
    work_id: int,
    work_token: int,
) -> IntakeResult:
    """Apply one issue version inside the caller's (fenced) transaction."""
    if issue.external_ref != key.external_ref:
        raise CustodyConflict(f"an observation of {issue.external_ref} was routed to custody of {key.external_ref}")
    row = conn.execute(
        """SELECT ticket_id FROM ticket_custody_links
            WHERE tenant = %s AND registration_key = %s AND external_ref = %s""",
        (key.tenant, key.registration_key, key.external_ref),
    ).fetchone()
    if row is None:
        return IntakeResult("created", _create(conn, key, project, issue, digest, labels, work_id, work_token))
    (ticket_id,) = row
    if not _observe(conn, ticket_id, issue, digest, work_id, work_token):
        return IntakeResult("unchanged", ticket_id)  # this exact version was observed before
    (latest,) = conn.execute(
        "SELECT max(source_updated_at) FROM ticket_observations WHERE ticket_id = %s", (ticket_id,)
    ).fetchone()
    if issue.external_updated_at < latest:
        return IntakeResult("stale", ticket_id)  # kept as a fact, but the ticket shows the newest version
    conn.execute(
        """UPDATE tickets
              SET title = %s, description = %s, labels = %s, source_state = %s, source_updated_at = %s,
                  source_digest = %s, version = version + 1, updated_at = clock_timestamp()
            WHERE ticket_id = %s""",
        (issue.title, issue.description, labels, issue.external_state, issue.external_updated_at, digest, ticket_id),
    )
    return IntakeResult("updated", ticket_id)


_CREATE = """
WITH ticket AS (
    INSERT INTO tickets (tenant, project, title, description, labels, priority, triage_state, source_state,
                         source_updated_at, source_digest)
    VALUES (%(tenant)s, %(project)s, %(title)s, %(description)s, %(labels)s, %(priority)s, 'UNTRIAGED', %(state)s,
            %(updated_at)s, %(digest)s)
    RETURNING ticket_id
), link AS (
    INSERT INTO ticket_custody_links (tenant, registration_key, external_ref, ticket_id, connector_kind, display_url,
                                      linked_by_work_id)
    SELECT %(tenant)s, %(key)s, %(ref)s, ticket_id, %(kind)s, %(url)s, %(work_id)s FROM ticket
), priority AS (
    INSERT INTO ticket_priority_facts (ticket_id, priority, prior_priority, actor, reason, recorded_at)
    SELECT ticket_id, %(priority)s, NULL, %(actor)s, 'automatic default at intake; not an actor decision',
           statement_timestamp() FROM ticket
), triage AS (
    -- one timestamp for both intake facts: the CTEs run in no defined order
    INSERT INTO ticket_triage_facts (ticket_id, triage_state, actor, reason, recorded_at)
    SELECT ticket_id, 'UNTRIAGED', %(actor)s, 'created by connector intake', statement_timestamp() FROM ticket
), finding AS (
    INSERT INTO attention_findings (kind, owner_role, tenant, project, ticket_id, opened_by)
    SELECT 'connector_triage_required', 'commander', %(tenant)s, %(project)s, ticket_id, %(actor)s FROM ticket
), observation AS (
    INSERT INTO ticket_observations (ticket_id, external_ref, source_digest, source_updated_at, issue, work_id,
                                     work_token)
    SELECT ticket_id, %(ref)s, %(digest)s, %(updated_at)s, %(issue)s, %(work_id)s, %(work_token)s FROM ticket
)
SELECT ticket_id FROM ticket
"""


def _create(conn: Connection, key: CustodyKey, project: str, issue: ExternalIssue, digest: str, labels: list[str],
            work_id: int, work_token: int) -> int:
    """The ticket, its custody link, the P2 and UNTRIAGED facts, the triage finding and the observation,
    in one statement."""
    (ticket_id,) = conn.execute(_CREATE, {
        "tenant": key.tenant, "key": key.registration_key, "ref": key.external_ref, "project": project,
        "title": issue.title, "description": issue.description, "labels": labels, "priority": DEFAULT_PRIORITY,
        "state": issue.external_state, "updated_at": issue.external_updated_at, "digest": digest,
        "kind": issue.connector_kind, "url": issue.display_url, "work_id": work_id, "work_token": work_token,
        "actor": INTAKE_ACTOR, "issue": Jsonb(issue.model_dump(mode="json")),
    }).fetchone()
    return ticket_id


def _observe(conn: Connection, ticket_id: int, issue: ExternalIssue, digest: str, work_id: int,
             work_token: int) -> bool:
    return conn.execute(
        """INSERT INTO ticket_observations (ticket_id, external_ref, source_digest, source_updated_at, issue, work_id,
                                            work_token)
           VALUES (%s, %s, %s, %s, %s, %s, %s)
           ON CONFLICT (ticket_id, source_digest) DO NOTHING""",
        (ticket_id, issue.external_ref, digest, issue.external_updated_at, Jsonb(issue.model_dump(mode="json")),
         work_id, work_token),
    ).rowcount == 1


SWEEP_GAP_FINDING = "connector_sweep_gap"


def open_sweep_gap_finding(conn: Connection, ticket_id: int, *, tenant: str, project: str) -> None:
    """The ticket's version was found by a reconciliation sweep, not by the incremental scans:
    its commander sees it on the Attention page until the ticket is triaged, which resolves it
    (so only an open, untriaged ticket gets one; the sweep's own record keeps every gap)."""
    conn.execute(
        """INSERT INTO attention_findings (kind, owner_role, tenant, project, ticket_id, opened_by)
           SELECT %s, 'commander', %s, %s, ticket_id, 'system:sweep' FROM tickets
            WHERE ticket_id = %s AND triage_state = 'UNTRIAGED' AND status = 'open'
           ON CONFLICT (ticket_id, kind) DO NOTHING""",
        (SWEEP_GAP_FINDING, tenant, project, ticket_id),
    )
