"""The project-scoped ticket commands (docs/design/triage-authority.md, "Commands").

* `triage_connector_ticket`: the project's commander records ACCEPTED, DUPLICATE or
  REJECTED, once, from UNTRIAGED. ACCEPTED needs an actor's priority assignment recorded
  after intake (the automatic P2 is no decision); DUPLICATE appends the duplicates
  relation to a same-project canonical ticket and cancels; REJECTED cancels. Each
  resolves the ticket's `connector_triage_required` finding.
* `set_connector_ticket_priority`: the commander or an operator of the project appends a
  priority assignment (prior and new value, reason) to an open connector ticket. Asking for
  the priority an actor already set is an `unchanged` reply that writes nothing; confirming
  the automatic one from intake is a decision and is recorded.
* `acknowledge_sweep_gap`: the project's commander resolves the ticket's unresolved
  `connector_sweep_gap` findings (a version the incremental scans missed and a
  reconciliation sweep re-observed), up to the newest one the commander was shown, with a
  reason; on a ticket in any state, since a gap can be found after triage or close.

One transaction each: the client command id is serialized by an advisory lock and a
recorded one replays its result when the arguments are the same (else it is refused);
the ticket row is locked and must be at `expected_version` (a conflict, never
last-write-wins); the role comes from `authority`; the command row, its append-only
facts and the ticket's projected state are written together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import Connection
from psycopg.types.json import Jsonb

from nexus_pipelines.actors.store import Principal
from nexus_pipelines.redaction import one_line
from nexus_pipelines.tickets.authority import ACKNOWLEDGE, PRIORITY, TRIAGE, CommandRefused, authorize

DISPOSITIONS = ("ACCEPTED", "DUPLICATE", "REJECTED")
TRIAGE_STATES = ("UNTRIAGED", *DISPOSITIONS)
PRIORITIES = ("P0", "P1", "P2", "P3", "P4")
REASON_MAX_CHARS = 500
COMMAND_ID_MAX_CHARS = 200


class VersionConflict(CommandRefused):
    """The ticket changed since the caller read it."""


@dataclass(frozen=True)
class CommandResult:
    command_seq: int | None  # None when nothing was recorded (`unchanged`)
    client_command_id: str
    ticket_id: int
    version: int
    triage_state: str
    priority: str
    status: str
    replayed: bool  # True: this client command id was recorded before; nothing was written
    unchanged: bool = False  # True: the ticket already was what the command asks for; nothing was written


@dataclass(frozen=True)
class _Ticket:
    ticket_id: int
    tenant: str
    project: str
    status: str
    triage_state: str
    priority: str
    version: int


@dataclass(frozen=True)
class _Spec:
    name: str
    action: str
    check: Callable[[Connection, _Ticket, dict], tuple[str, str, str]]  # -> (triage_state, priority, status)
    write: Callable[[Connection, _Ticket, int, Principal, str, dict], None]
    unchanged: Callable[[Connection, _Ticket, dict], bool] = lambda conn, ticket, args: False


def triage_connector_ticket(conn: Connection, principal: Principal, *, client_command_id: str, ticket_id: int,
                            expected_version: int, disposition: str, canonical_ticket_id: int | None = None,
                            reason: str) -> CommandResult:
    disposition = str(disposition).strip().upper()
    if disposition not in DISPOSITIONS:
        raise CommandRefused(f"disposition {disposition!r} is not one of {', '.join(DISPOSITIONS)}")
    if (canonical_ticket_id is None) == (disposition == "DUPLICATE"):
        raise CommandRefused("a DUPLICATE disposition names its canonical ticket, and only a DUPLICATE does")
    arguments = {"disposition": disposition, "canonical_ticket_id": canonical_ticket_id, "reason": _reason(reason)}
    return _run(conn, principal, _TRIAGE, client_command_id, ticket_id, expected_version, arguments)


def set_connector_ticket_priority(conn: Connection, principal: Principal, *, client_command_id: str, ticket_id: int,
                                  expected_version: int, priority: str, reason: str) -> CommandResult:
    priority = str(priority).strip().upper()
    if priority not in PRIORITIES:
        raise CommandRefused(f"priority {priority!r} is not one of {', '.join(PRIORITIES)}")
    arguments = {"priority": priority, "reason": _reason(reason)}
    return _run(conn, principal, _PRIORITY, client_command_id, ticket_id, expected_version, arguments)


def acknowledge_sweep_gap(conn: Connection, principal: Principal, *, client_command_id: str, ticket_id: int,
                          expected_version: int, through_finding_id: int, reason: str) -> CommandResult:
    """Resolve the ticket's unresolved sweep-gap findings numbered up to `through_finding_id`
    (the newest the commander saw: a gap found meanwhile stays waiting)."""
    if isinstance(through_finding_id, bool) or not isinstance(through_finding_id, int) or through_finding_id < 1:
        raise CommandRefused("through_finding_id is the newest sweep-gap finding you were shown (a positive number)")
    arguments = {"through_finding_id": through_finding_id, "reason": _reason(reason)}
    return _run(conn, principal, _ACKNOWLEDGE, client_command_id, ticket_id, expected_version, arguments)


def _reason(reason: str) -> str:
    text = one_line(reason, REASON_MAX_CHARS)
    if not text:
        raise CommandRefused("a reason is needed: say why, for the ticket's audit trail")
    return text


def _run(conn: Connection, principal: Principal, spec: _Spec, client_command_id: str, ticket_id: int,
         expected_version: int, arguments: dict[str, Any]) -> CommandResult:
    if not client_command_id or len(client_command_id) > COMMAND_ID_MAX_CHARS or client_command_id != \
            client_command_id.strip():
        raise CommandRefused(f"a client command id of 1 to {COMMAND_ID_MAX_CHARS} characters is needed")
    if isinstance(expected_version, bool) or not isinstance(expected_version, int) or expected_version < 1:
        raise CommandRefused("expected_version is the ticket version the decision was made on (a positive number)")
    fingerprint = {"ticket_id": ticket_id, "expected_version": expected_version, **arguments}
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                         (f"ticket-command:{client_command_id}",))
            replayed = _replay(conn, principal, spec.name, client_command_id, fingerprint)
            if replayed is not None:
                return replayed
            ticket = _lock(conn, ticket_id)
            role = authorize(conn, principal, spec.action, ticket.tenant, ticket.project)
            if ticket.version != expected_version:
                raise VersionConflict(f"ticket {ticket_id} is at version {ticket.version}, not {expected_version}: "
                                      "it changed since you read it; reload it and decide again")
            triage_state, priority, status = spec.check(conn, ticket, arguments)
            if spec.unchanged(conn, ticket, arguments):
                return CommandResult(None, client_command_id, ticket_id, ticket.version, ticket.triage_state,
                                     ticket.priority, ticket.status, replayed=False, unchanged=True)
            result = {"ticket_id": ticket_id, "version": ticket.version + 1, "triage_state": triage_state,
                      "priority": priority, "status": status}
            (seq,) = conn.execute(
                """INSERT INTO ticket_commands (client_command_id, command, ticket_id, actor_id, actor_role,
                                                arguments, result)
                   VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING command_seq""",
                (client_command_id, spec.name, ticket_id, principal.actor_id, role, Jsonb(fingerprint),
                 Jsonb(result))).fetchone()
            spec.write(conn, ticket, seq, principal, role, arguments)
            conn.execute(
                """UPDATE tickets SET triage_state = %s, priority = %s, status = %s, version = version + 1,
                          updated_at = clock_timestamp() WHERE ticket_id = %s""",
                (triage_state, priority, status, ticket_id))
    except psycopg.errors.DeadlockDetected:
        raise VersionConflict(f"ticket {ticket_id} was changed by a concurrent command; reload it and decide "
                              "again") from None
    return _result(seq, client_command_id, result, replayed=False)


def _replay(conn: Connection, principal: Principal, name: str, client_command_id: str,
            fingerprint: dict) -> CommandResult | None:
    row = conn.execute(
        "SELECT command_seq, command, actor_id, arguments, result FROM ticket_commands WHERE client_command_id = %s",
        (client_command_id,)).fetchone()
    if row is None:
        return None
    seq, command, actor_id, arguments, result = row
    if (command, actor_id, arguments) != (name, principal.actor_id, fingerprint):
        raise CommandRefused(f"client command id {client_command_id!r} was already used for a different command; "
                             "use a new id for a new decision")
    return _result(seq, client_command_id, result, replayed=True)


def _result(seq: int, client_command_id: str, result: dict, *, replayed: bool) -> CommandResult:
    return CommandResult(seq, client_command_id, result["ticket_id"], result["version"], result["triage_state"],
                         result["priority"], result["status"], replayed)


def _lock(conn: Connection, ticket_id: int) -> _Ticket:
    row = conn.execute(
        """SELECT t.ticket_id, t.tenant, t.project, t.status, t.triage_state, t.priority, t.version,
                  l.external_ref IS NOT NULL
             FROM tickets t LEFT JOIN ticket_custody_links l USING (ticket_id)
            WHERE t.ticket_id = %s FOR UPDATE OF t""", (ticket_id,)).fetchone()
    if row is None:
        raise CommandRefused(f"ticket {ticket_id} does not exist")
    if not row[-1]:
        raise CommandRefused(f"ticket {ticket_id} was not created by a connector; these commands triage connector "
                             "tickets only")
    return _Ticket(*row[:-1])


# -- triage -------------------------------------------------------------------------------

def _check_triage(conn: Connection, ticket: _Ticket, args: dict) -> tuple[str, str, str]:
    if ticket.triage_state != "UNTRIAGED":
        raise CommandRefused(f"ticket {ticket.ticket_id} is already {ticket.triage_state}; triage is recorded once, "
                             "from UNTRIAGED")
    if ticket.status != "open":
        raise CommandRefused(f"ticket {ticket.ticket_id} is {ticket.status}; only an open ticket is triaged")
    disposition = args["disposition"]
    if disposition == "ACCEPTED" and not _actor_set_priority(conn, ticket):
        raise CommandRefused(f"ticket {ticket.ticket_id} has only the automatic {ticket.priority} from intake; a "
                             "commander or operator sets its priority before it is accepted")
    if disposition == "DUPLICATE":
        _check_canonical(conn, ticket, args["canonical_ticket_id"])
    return disposition, ticket.priority, "open" if disposition == "ACCEPTED" else "cancelled"


def _check_canonical(conn: Connection, ticket: _Ticket, canonical_id: int) -> None:
    if canonical_id == ticket.ticket_id:
        raise CommandRefused(f"ticket {ticket.ticket_id} cannot duplicate itself")
    row = conn.execute("SELECT tenant, project, status FROM tickets WHERE ticket_id = %s FOR SHARE",
                       (canonical_id,)).fetchone()
    if row is None:
        raise CommandRefused(f"canonical ticket {canonical_id} does not exist")
    if tuple(row[:2]) != (ticket.tenant, ticket.project):
        raise CommandRefused(f"canonical ticket {canonical_id} belongs to another project; a duplicate names a "
                             f"ticket of {ticket.tenant}/{ticket.project}")
    if row[2] == "cancelled":
        raise CommandRefused(f"canonical ticket {canonical_id} is cancelled; name the ticket that carries the work")


def _write_triage(conn: Connection, ticket: _Ticket, seq: int, principal: Principal, role: str, args: dict) -> None:
    disposition = args["disposition"]
    if disposition == "DUPLICATE":
        conn.execute("""INSERT INTO ticket_relations (ticket_id, relation, related_ticket_id, command_seq)
                        VALUES (%s, 'duplicates', %s, %s)""", (ticket.ticket_id, args["canonical_ticket_id"], seq))
    conn.execute("""INSERT INTO ticket_triage_facts (ticket_id, triage_state, actor, reason, actor_role, command_seq)
                    VALUES (%s, %s, %s, %s, %s, %s)""",
                 (ticket.ticket_id, disposition, principal.actor_id, args["reason"], role, seq))
    conn.execute(
        """INSERT INTO attention_resolutions (finding_id, command_seq, disposition)
           SELECT f.finding_id, %s, %s FROM attention_findings f
            WHERE f.ticket_id = %s AND f.kind IN ('connector_triage_required', 'connector_sweep_gap')
              AND NOT EXISTS (SELECT 1 FROM attention_resolutions r WHERE r.finding_id = f.finding_id)""",
        (seq, disposition, ticket.ticket_id))


# -- priority -----------------------------------------------------------------------------

def _check_priority(conn: Connection, ticket: _Ticket, args: dict) -> tuple[str, str, str]:
    if ticket.status != "open":
        raise CommandRefused(f"ticket {ticket.ticket_id} is {ticket.status}; priority is set on open tickets only")
    return ticket.triage_state, args["priority"], ticket.status


def _actor_set_priority(conn: Connection, ticket: _Ticket) -> bool:
    """Whether an actor's command has assigned the ticket a priority (intake's P2 is no decision)."""
    return conn.execute("SELECT 1 FROM ticket_priority_facts WHERE ticket_id = %s AND command_seq IS NOT NULL LIMIT 1",
                        (ticket.ticket_id,)).fetchone() is not None


def _same_priority(conn: Connection, ticket: _Ticket, args: dict) -> bool:
    # The projection's priority is the latest fact's: once an actor has set one, the current value is a decision.
    return args["priority"] == ticket.priority and _actor_set_priority(conn, ticket)


def _write_priority(conn: Connection, ticket: _Ticket, seq: int, principal: Principal, role: str,
                    args: dict) -> None:
    conn.execute(
        """INSERT INTO ticket_priority_facts (ticket_id, priority, prior_priority, actor, reason, actor_role,
                                              command_seq)
           VALUES (%s, %s, %s, %s, %s, %s, %s)""",
        (ticket.ticket_id, args["priority"], ticket.priority, principal.actor_id, args["reason"], role, seq))


# -- sweep gaps ---------------------------------------------------------------------------

_WAITING_GAPS = """SELECT f.finding_id FROM attention_findings f
                    WHERE f.ticket_id = %s AND f.kind = 'connector_sweep_gap' AND f.finding_id <= %s
                      AND NOT EXISTS (SELECT 1 FROM attention_resolutions r WHERE r.finding_id = f.finding_id)"""


def _check_acknowledge(conn: Connection, ticket: _Ticket, args: dict) -> tuple[str, str, str]:
    if conn.execute(_WAITING_GAPS, (ticket.ticket_id, args["through_finding_id"])).fetchone() is None:
        raise CommandRefused(f"ticket {ticket.ticket_id} has no unresolved sweep-gap finding up to "
                             f"{args['through_finding_id']}; reload it to see what is waiting")
    return ticket.triage_state, ticket.priority, ticket.status


def _write_acknowledge(conn: Connection, ticket: _Ticket, seq: int, principal: Principal, role: str,
                       args: dict) -> None:
    conn.execute(f"""INSERT INTO attention_resolutions (finding_id, command_seq, disposition)
                     SELECT finding_id, %s, 'ACKNOWLEDGED' FROM ({_WAITING_GAPS}) w""",
                 (seq, ticket.ticket_id, args["through_finding_id"]))


_TRIAGE = _Spec("triage_connector_ticket", TRIAGE, _check_triage, _write_triage)
_PRIORITY = _Spec("set_connector_ticket_priority", PRIORITY, _check_priority, _write_priority, _same_priority)
_ACKNOWLEDGE = _Spec("acknowledge_sweep_gap", ACKNOWLEDGE, _check_acknowledge, _write_acknowledge)
