"""`nexus-pipelines tickets ...`: connector tickets and their success proofs."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import sys
import uuid

import click

from nexus_pipelines.cli_common import UserError, control_connection, operator
from nexus_pipelines.tickets.commands import DISPOSITIONS, PRIORITIES, TRIAGE_STATES


@click.group("tickets")
def tickets() -> None:
    """Tickets created from connector intake."""


@tickets.command("list")
@click.option("--registration", default=None, help="Only this registration (tenant/key).")
@click.option("--status", type=click.Choice(["open", "done", "cancelled"]), default=None)
@click.option("--triage", type=click.Choice(TRIAGE_STATES), default=None)
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
    for finding in detail["findings"]:
        state = f"resolved {finding['disposition']}" if finding["disposition"] else \
            f"unresolved, waiting {finding['age_s']}s"
        click.echo(f"  attention: finding {finding['finding_id']} {finding['kind']} for the {finding['owner_role']}, "
                   f"{state}")
    for relation in detail["relations"]:
        verb = relation["relation"] if relation["direction"] == "outgoing" else f"{relation['relation']} (by)"
        click.echo(f"  {verb} ticket {relation['ticket_id']}")
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


CREDENTIAL_ENV = "NEXUS_ACTOR_CREDENTIAL"


def _credential() -> str:
    """The actor credential from NEXUS_ACTOR_CREDENTIAL or a hidden prompt: never an argument,
    which would land in shell history and in every process listing."""
    credential = os.environ.get(CREDENTIAL_ENV)
    if credential:
        return credential
    if not sys.stdin.isatty():
        raise UserError(f"no actor credential given: export {CREDENTIAL_ENV} (or run in a terminal to be asked for it)")
    return click.prompt("actor credential", hide_input=True)


def _decide(command, **arguments) -> None:
    from nexus_pipelines.actors.store import AuthenticationFailed, authenticate
    from nexus_pipelines.tickets.authority import CommandRefused

    credential = _credential()
    with control_connection() as conn:
        try:
            result = command(conn, authenticate(conn, credential), **arguments)
        except (AuthenticationFailed, CommandRefused) as exc:
            raise UserError(f"refused: {exc}") from None
    note = (" (replayed: recorded before, nothing new written)" if result.replayed else
            f" (unchanged: already {result.priority}, nothing recorded)" if result.unchanged else "")
    click.echo(f"ticket {result.ticket_id}: {result.triage_state} at {result.priority}, {result.status}, version "
               f"{result.version}; command {result.client_command_id}{note}")


_COMMAND_ID = click.option("--command-id", default=None,
                           help="Idempotency key: the same id with the same arguments replays the result.")
_VERSION = click.option("--expected-version", type=click.IntRange(1), required=True,
                        help="The ticket version you decided on (`tickets show`); a newer one is a conflict.")


@tickets.command("triage")
@click.argument("ticket_id", type=int)
@click.option("--disposition", type=click.Choice([d.lower() for d in DISPOSITIONS], case_sensitive=False),
              required=True)
@click.option("--canonical", "canonical_ticket_id", type=int, default=None,
              help="For a duplicate: the same-project ticket that carries the work.")
@click.option("--reason", required=True)
@_VERSION
@_COMMAND_ID
def triage_cmd(ticket_id, disposition, canonical_ticket_id, reason, expected_version, command_id) -> None:
    """Record the project commander's triage of a connector ticket (credential: NEXUS_ACTOR_CREDENTIAL or a prompt)."""
    from nexus_pipelines.tickets.commands import triage_connector_ticket

    _decide(triage_connector_ticket, client_command_id=command_id or f"cli:{uuid.uuid4()}", ticket_id=ticket_id,
            expected_version=expected_version, disposition=disposition, canonical_ticket_id=canonical_ticket_id,
            reason=reason)


@tickets.command("priority")
@click.argument("ticket_id", type=int)
@click.option("--priority", type=click.Choice(PRIORITIES, case_sensitive=False), required=True)
@click.option("--reason", required=True)
@_VERSION
@_COMMAND_ID
def priority_cmd(ticket_id, priority, reason, expected_version, command_id) -> None:
    """Set a connector ticket's priority as its commander or an operator (credential as for `triage`)."""
    from nexus_pipelines.tickets.commands import set_connector_ticket_priority

    _decide(set_connector_ticket_priority, client_command_id=command_id or f"cli:{uuid.uuid4()}",
            ticket_id=ticket_id, expected_version=expected_version, priority=priority, reason=reason)


@tickets.command("acknowledge")
@click.argument("ticket_id", type=int)
@click.option("--through-finding", "through_finding_id", type=click.IntRange(1), required=True,
              help="The newest sweep-gap finding you read (`tickets show`); a gap found later stays waiting.")
@click.option("--reason", required=True)
@_VERSION
@_COMMAND_ID
def acknowledge_cmd(ticket_id, through_finding_id, reason, expected_version, command_id) -> None:
    """Resolve a ticket's sweep-gap findings as its commander (credential as for `triage`)."""
    from nexus_pipelines.tickets.commands import acknowledge_sweep_gap

    _decide(acknowledge_sweep_gap, client_command_id=command_id or f"cli:{uuid.uuid4()}", ticket_id=ticket_id,
            expected_version=expected_version, through_finding_id=through_finding_id, reason=reason)


@tickets.command("rebuild")
def rebuild_cmd() -> None:
    """Recompute every ticket's triage state, priority and status from its facts."""
    from nexus_pipelines.tickets.projection import rebuild

    with control_connection() as conn:
        corrected = rebuild(conn)
    click.echo(f"projection rebuilt from the facts: {corrected} ticket rows corrected")


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@tickets.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=3100, type=click.IntRange(1, 65535), show_default=True)
@click.option("--secure-cookies/--no-secure-cookies", default=False, show_default=True,
              help="Mark the session cookie Secure (serve behind HTTPS).")
def serve_cmd(host: str, port: int, secure_cookies: bool) -> None:
    """Serve the Board, Ticket Detail and Attention pages."""
    if not secure_cookies and not _loopback(host):
        raise UserError(f"--host {host} serves the pages beyond this machine: serve them behind HTTPS and pass "
                        "--secure-cookies (a session cookie must not travel in clear text)")
    try:
        import uvicorn

        from nexus_pipelines.tickets.web.app import build_app
    except ImportError as exc:
        raise UserError(f"the pages need starlette and uvicorn ({exc.name} is missing): install "
                        "nexus-pipelines[local]") from None
    from nexus_pipelines.cli_common import control_dsn
    from nexus_pipelines.control.db import make_pool

    with control_connection():  # fail fast, in one line, when the control plane is unreachable
        pass
    pool = make_pool(control_dsn(), max_size=8, check_on_checkout=True)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)  # the pages log each outage once, not each retry
    click.echo(f"ticket pages on http://{host}:{port}/ (sign in with an actor credential)")
    try:
        uvicorn.run(build_app(pool, secure_cookies=secure_cookies), host=host, port=port, log_level="warning")
    finally:
        pool.close()
