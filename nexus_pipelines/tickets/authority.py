"""Who may do what to connector tickets: the one rule (docs/design/triage-authority.md).

Only a project's commander triages its tickets and acknowledges their sweep gaps; its
commander or an operator of it sets their priority. The role is the principal's live membership of the ticket's project,
read inside the command's transaction: never a role the caller names, a hidden field or
what a page rendered. The pages ask `allowed_actions` only to decide which controls to
show; the command asks `authorize` again when it runs.
"""

from __future__ import annotations

from psycopg import Connection

from nexus_pipelines.actors.store import Principal, role_in

TRIAGE = "triage"
PRIORITY = "priority"
ACKNOWLEDGE = "acknowledge"
MAY = {TRIAGE: ("commander",), PRIORITY: ("commander", "operator"), ACKNOWLEDGE: ("commander",)}


class CommandRefused(RuntimeError):
    """A ticket command that cannot be carried out; one line saying why and what to do."""


class NotAuthorized(CommandRefused):
    pass


def authorize(conn: Connection, principal: Principal, action: str, tenant: str, project: str) -> str:
    """The principal's role on the project if it may take `action` there."""
    role = role_in(conn, principal, tenant, project)
    if role not in MAY[action]:
        # an actor with no role there is not told which project the ticket belongs to
        held = f"is {role} of project {tenant}/{project}" if role else "has no role on the ticket's project"
        raise NotAuthorized(f"{principal.actor_id} {held}; {action} needs {' or '.join(MAY[action])}")
    return role


def allowed_actions(conn: Connection, principal: Principal, tenant: str, project: str) -> frozenset[str]:
    role = role_in(conn, principal, tenant, project)
    return frozenset(action for action, roles in MAY.items() if role in roles)
