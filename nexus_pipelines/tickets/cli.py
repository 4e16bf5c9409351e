"""`nexus-pipelines tickets ...`: connector tickets and their success proofs."""

from __future__ import annotations

import json
import uuid

import click

from nexus_pipelines.cli_common import UserError, control_connection, operator


@click.group("tickets")
def tickets() -> None:
    """Tickets created from connector intake."""


@tickets.command("list")
@click.option("--registration", default=None, help="Only this registration (tenant/key).")
@click.option("--status", type=click.Choice(["open", "done", "cancelled"]), default=None)
@click.option("--triage", type=click.Choice(["UNTRIAGED", "ACCEPTED", "DUPLICATE", "REJECTED"]), default=None)
@click.option("--after", default=0, type=int, help="Page after this ticket id.")
@click.option("--limit", default=50, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True)
def list_cmd(registration, status, triage, after, limit, as_json) -> None:
    """Tickets with their source, triage state, priority and close-back state."""
    from nexus_pipelines.tickets.queries import list_tickets

    with control_connection() as conn:
        rows = list_tickets(conn, registration_id=registration, status=status, triage_state=triage, limit=limit,
                            after_id=after)
    if not rows and not as_json:
        click.echo("no tickets match")
    for row in rows:
        if as_json:
            click.echo(json.dumps(row.__dict__, default=str, sort_keys=True))
        else:
            closed = " closed-at-source" if row.closed_at_source else ""
            click.echo(f"{row.ticket_id}\t{row.external_ref}\t{row.status}\t{row.triage_state}\t{row.priority}"
                       f"{closed}\t{row.title[:70]}")


@tickets.command("show")
@click.argument("ticket_id", type=int)
@click.option("--json", "as_json", is_flag=True)
def show_cmd(ticket_id: int, as_json: bool) -> None:
    """One ticket with its custody, observations, facts, proofs and close commands."""
    from nexus_pipelines.tickets.queries import ticket_detail

    with control_connection() as conn:
        detail = ticket_detail(conn, ticket_id)
    if detail is None:
        raise UserError(f"ticket {ticket_id} does not exist")
    if as_json:
        click.echo(json.dumps(detail, default=str, sort_keys=True))
        return
    click.echo(f"ticket {detail['ticket_id']}: {detail['title']}")
    click.echo(f"  source {detail['external_ref']} ({detail['display_url']}), state {detail['source_state']}")
    click.echo(f"  status {detail['status']}, triage {detail['triage_state']}, priority {detail['priority']}, "
               f"version {detail['version']}")
    for name in ("observations", "priority_facts", "triage_facts", "proofs", "close_commands"):
        click.echo(f"  {name.replace('_', ' ')}: {len(detail[name])}")
        for row in detail[name]:
            click.echo("    " + ", ".join(f"{k}={v}" for k, v in row.items() if v is not None))


@tickets.command("prove")
@click.argument("ticket_id", type=int)
@click.option("--evidence", required=True, help="What proves the project work succeeded (release, link, test).")
@click.option("--request-id", default=None, help="Idempotency key: the same id replays the same result.")
def prove_cmd(ticket_id: int, evidence: str, request_id: str | None) -> None:
    """Record an accepted success proof: creates the one close command and its issue.close work item."""
    from nexus_pipelines.tickets.proofs import ProofRefused, record_proof

    request_id = request_id or f"cli:{uuid.uuid4()}"
    with control_connection() as conn:
        try:
            result = record_proof(conn, ticket_id, evidence=evidence, recorded_by=operator(),
                                  client_request_id=request_id)
        except ProofRefused as exc:
            raise UserError(f"proof refused: {exc}") from None
    state = "recorded" if result.created else "was already recorded"
    click.echo(f"proof {result.proof_id} for ticket {ticket_id} {state}; close command {result.command_id} runs "
               f"with the next drain (request id {request_id})")
