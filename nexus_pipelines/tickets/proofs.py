"""Accepted Project success proofs, and the one close command each creates
(docs/design/connector-contract.md, "Close-back").

Only an accepted proof for a connector ticket its project commander ACCEPTED creates a
close command: source state, labels, comments, ticket text, and duplicate or rejected
dispositions never do (docs/design/triage-authority.md). Recording the proof, its
deterministic close command and that command's `issue.close` work item is one
transaction; the same client request id replays the same result, and a ticket takes
one accepted proof.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import Connection

from nexus_pipelines.connectors.core.closeback import EVIDENCE_MAX_CHARS, close_comment, command_id, marker
from nexus_pipelines.redaction import one_line
from nexus_pipelines.workqueue.receipts import NewWork, enqueue_work_items

CLOSE_WORK_TYPE = "issue.close"
CLOSE_ROUTE = ("issue.close", 1)


class ProofRefused(RuntimeError):
    """The proof cannot be accepted; one line naming the ticket and the reason."""


@dataclass(frozen=True)
class ProofResult:
    proof_id: int
    command_id: str
    ticket_id: int
    created: bool  # False: the same request was recorded before


def ticket_lane(external_ref: str) -> str:
    """The target mutation lane of everything that writes one connector ticket."""
    return f"ticket:{external_ref}"


def _eligibility(conn: Connection, ticket_id: int) -> tuple:
    row = conn.execute(
        """SELECT t.status, t.triage_state, l.tenant, l.registration_key, l.external_ref
             FROM tickets t LEFT JOIN ticket_custody_links l USING (ticket_id)
            WHERE t.ticket_id = %s FOR UPDATE OF t""",
        (ticket_id,),
    ).fetchone()
    if row is None:
        raise ProofRefused(f"ticket {ticket_id} does not exist")
    status, triage, tenant, key, external_ref = row
    if external_ref is None:
        raise ProofRefused(f"ticket {ticket_id} has no connector source to close")
    if triage != "ACCEPTED" or status == "cancelled":
        raise ProofRefused(f"ticket {ticket_id} is {'cancelled' if status == 'cancelled' else triage}; only a "
                           "ticket its project commander ACCEPTED takes a success proof")
    return status, tenant, key, external_ref


def record_proof(conn: Connection, ticket_id: int, *, evidence: str, recorded_by: str,
                 client_request_id: str) -> ProofResult:
    evidence = one_line(evidence, EVIDENCE_MAX_CHARS)
    if not evidence:
        raise ProofRefused("a success proof needs evidence text")
    if not client_request_id or len(client_request_id) > 200:
        raise ProofRefused("a success proof needs a client request id of at most 200 characters")
    with conn.transaction():
        replay = conn.execute(
            """SELECT p.proof_id, c.command_id, p.evidence FROM ticket_proofs p
                 JOIN ticket_close_commands c USING (proof_id)
                WHERE p.ticket_id = %s AND p.client_request_id = %s""",
            (ticket_id, client_request_id),
        ).fetchone()
        if replay is not None:
            if replay[2] != evidence:
                raise ProofRefused(f"request {client_request_id!r} was recorded for ticket {ticket_id} with other "
                                   "evidence; use a new request id")
            return ProofResult(replay[0], replay[1], ticket_id, created=False)
        status, tenant, key, external_ref = _eligibility(conn, ticket_id)
        existing = conn.execute("SELECT proof_id FROM ticket_proofs WHERE ticket_id = %s", (ticket_id,)).fetchone()
        if existing is not None:
            raise ProofRefused(f"ticket {ticket_id} already has accepted success proof {existing[0]}")
        revision = conn.execute(
            """SELECT revision_no FROM connector_registrations
                WHERE tenant = %s AND registration_key = %s AND status = 'active'""",
            (tenant, key),
        ).fetchone()
        if revision is None:
            raise ProofRefused(f"registration {tenant}/{key} has no active revision to close ticket {ticket_id} "
                               "through; activate it first")
        (proof_id,) = conn.execute(
            """INSERT INTO ticket_proofs (ticket_id, proof_kind, verdict, evidence, recorded_by, client_request_id)
               VALUES (%s, 'project_success', 'accepted', %s, %s, %s) RETURNING proof_id""",
            (ticket_id, evidence, recorded_by, client_request_id),
        ).fetchone()
        command = command_id(tenant, ticket_id, proof_id)
        comment = close_comment(ticket_id=ticket_id, proof_id=proof_id, evidence=evidence, recorded_by=recorded_by,
                                command=command)
        conn.execute(
            """INSERT INTO ticket_close_commands (command_id, ticket_id, proof_id, tenant, registration_key,
                                                  external_ref, marker, comment)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s)""",
            (command, ticket_id, proof_id, tenant, key, external_ref, marker(command), comment),
        )
        conn.execute(
            "UPDATE tickets SET status = 'done', version = version + 1, updated_at = clock_timestamp()"
            " WHERE ticket_id = %s",
            (ticket_id,),
        )
        enqueue_work_items(
            conn,
            [NewWork(idempotency_key=command, work_type=CLOSE_WORK_TYPE, source_lane_key=external_ref,
                     target_lane_key=ticket_lane(external_ref), payload={"command_id": command},
                     source_kind="close_command")],
            registration_id=f"{tenant}/{key}", revision=revision[0], route_id=CLOSE_ROUTE[0],
            route_version=CLOSE_ROUTE[1],
        )
    return ProofResult(proof_id, command, ticket_id, created=True)
