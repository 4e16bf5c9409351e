"""Actors, their credentials and project memberships in the control plane.

Whoever can reach the control-plane database administers actors (the `actors` CLI); every
other authority comes from `authenticate`, which turns a presented credential into a
`Principal`. A principal carries only who the actor is: the role on a project is read
from the live membership whenever a command needs it, never taken from the caller.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from psycopg import Connection

from nexus_pipelines.actors import credentials

ROLES = ("commander", "operator")
ACTOR_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


class ActorError(ValueError):
    """An administration request that cannot be carried out; one line naming the input."""


class AuthenticationFailed(RuntimeError):
    """The presented credential is not valid; one message for every reason, no oracle."""

    def __init__(self) -> None:
        super().__init__("the actor credential is not valid (revoked, mistyped or never issued)")


@dataclass(frozen=True)
class Principal:
    """An authenticated actor: made only by `authenticate` (and the page sessions built on it)."""

    actor_id: str
    credential_id: str


@dataclass(frozen=True)
class Membership:
    tenant: str
    project: str
    role: str

    @property
    def project_id(self) -> str:
        return f"{self.tenant}/{self.project}"


def split_project(project_id: str) -> tuple[str, str]:
    tenant, sep, project = project_id.partition("/")
    if not sep or not tenant or not project:
        raise ActorError(f"project {project_id!r} must read tenant/project, as a registration names it")
    return tenant, project


def _store_credential(conn: Connection, actor_id: str, issued_by: str) -> str:
    issued = credentials.issue()
    conn.execute(
        """INSERT INTO actor_credentials (credential_id, actor_id, kdf, salt, hash, issued_by)
           VALUES (%s, %s, %s, %s, %s, %s)""",
        (issued.credential_id, actor_id, issued.kdf, issued.salt, issued.hash, issued_by),
    )
    return issued.text


def add_actor(conn: Connection, actor_id: str, *, display_name: str, created_by: str) -> str:
    """Create the actor and return its credential: the only time the credential exists in clear."""
    if not ACTOR_PATTERN.match(actor_id):
        raise ActorError(f"actor id {actor_id!r} must be lower-case letters, digits, '.', '_' or '-' (at most 63)")
    if not display_name.strip() or len(display_name) > 100:
        raise ActorError("a display name of 1 to 100 characters is needed")
    with conn.transaction():
        if conn.execute("SELECT 1 FROM actors WHERE actor_id = %s", (actor_id,)).fetchone():
            raise ActorError(f"actor {actor_id} exists; `actors reissue {actor_id}` gives it a new credential")
        conn.execute("INSERT INTO actors (actor_id, display_name, created_by) VALUES (%s, %s, %s)",
                     (actor_id, display_name.strip(), created_by))
        return _store_credential(conn, actor_id, created_by)


def _require_actor(conn: Connection, actor_id: str) -> None:
    if conn.execute("SELECT 1 FROM actors WHERE actor_id = %s", (actor_id,)).fetchone() is None:
        raise ActorError(f"actor {actor_id} does not exist; add it with `nexus-pipelines actors add {actor_id}`")


def reissue(conn: Connection, actor_id: str, *, issued_by: str) -> str:
    """Revoke the live credential (its sessions end with it) and issue a new one."""
    with conn.transaction():
        _require_actor(conn, actor_id)
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('actor:' || %s, 0))", (actor_id,))
        conn.execute("UPDATE actor_credentials SET revoked_at = clock_timestamp() WHERE actor_id = %s"
                     " AND revoked_at IS NULL", (actor_id,))
        return _store_credential(conn, actor_id, issued_by)


def grant(conn: Connection, actor_id: str, project_id: str, role: str, *, granted_by: str) -> str:
    """Give the actor `role` on the project (replacing another role); returns what happened."""
    tenant, project = split_project(project_id)
    if role not in ROLES:
        raise ActorError(f"role {role!r} is not one of {', '.join(ROLES)}")
    with conn.transaction():
        _require_actor(conn, actor_id)
        if conn.execute("SELECT 1 FROM projects WHERE tenant = %s AND project = %s", (tenant, project)).fetchone() \
                is None:
            raise ActorError(f"no registration names project {project_id}; activate its connector registration "
                             "first (`nexus-pipelines connectors activate`)")
        current = _live_role(conn, actor_id, tenant, project, lock=True)
        if current == role:
            return "unchanged"
        if current is not None:
            _revoke(conn, actor_id, tenant, project, granted_by)
        conn.execute("""INSERT INTO project_memberships (tenant, project, actor_id, role, granted_by)
                        VALUES (%s, %s, %s, %s, %s)""", (tenant, project, actor_id, role, granted_by))
        return "changed" if current else "granted"


def revoke(conn: Connection, actor_id: str, project_id: str, *, revoked_by: str) -> bool:
    tenant, project = split_project(project_id)
    with conn.transaction():
        return _revoke(conn, actor_id, tenant, project, revoked_by)


def _revoke(conn: Connection, actor_id: str, tenant: str, project: str, by: str) -> bool:
    return conn.execute(
        """UPDATE project_memberships SET revoked_at = clock_timestamp(), revoked_by = %s
            WHERE tenant = %s AND project = %s AND actor_id = %s AND revoked_at IS NULL""",
        (by, tenant, project, actor_id)).rowcount == 1


def _live_role(conn: Connection, actor_id: str, tenant: str, project: str, *, lock: bool = False) -> str | None:
    row = conn.execute(
        "SELECT role FROM project_memberships WHERE tenant = %s AND project = %s AND actor_id = %s"
        " AND revoked_at IS NULL" + (" FOR UPDATE" if lock else ""),
        (tenant, project, actor_id)).fetchone()
    return row[0] if row else None


def authenticate(conn: Connection, credential: str) -> Principal:
    try:
        credential_id, secret = credentials.parse(credential)
    except credentials.CredentialInvalid:
        raise AuthenticationFailed() from None
    row = conn.execute(
        "SELECT actor_id, salt, kdf, hash FROM actor_credentials WHERE credential_id = %s AND revoked_at IS NULL",
        (credential_id,)).fetchone()
    actor_id, salt, kdf, stored = row if row else (None, None, None, None)
    if not credentials.matches(secret, salt and bytes(salt), kdf, stored and bytes(stored)):
        raise AuthenticationFailed()
    return Principal(actor_id, credential_id)


def role_in(conn: Connection, principal: Principal, tenant: str, project: str) -> str | None:
    """The principal's live role on the project, read now (a revoked grant is no role)."""
    return _live_role(conn, principal.actor_id, tenant, project)


def memberships(conn: Connection, principal: Principal) -> list[Membership]:
    rows = conn.execute(
        "SELECT tenant, project, role FROM project_memberships WHERE actor_id = %s AND revoked_at IS NULL"
        " ORDER BY tenant, project", (principal.actor_id,)).fetchall()
    return [Membership(*row) for row in rows]


@dataclass(frozen=True)
class ActorRow:
    actor_id: str
    display_name: str
    credential_issued_at: object
    memberships: tuple[str, ...]


def list_actors(conn: Connection) -> list[ActorRow]:
    rows = conn.execute(
        """SELECT a.actor_id, a.display_name,
                  (SELECT issued_at FROM actor_credentials c WHERE c.actor_id = a.actor_id AND revoked_at IS NULL),
                  coalesce(array_agg(m.tenant || '/' || m.project || ':' || m.role ORDER BY m.tenant, m.project)
                           FILTER (WHERE m.membership_id IS NOT NULL), '{}')
             FROM actors a LEFT JOIN project_memberships m ON m.actor_id = a.actor_id AND m.revoked_at IS NULL
            GROUP BY a.actor_id, a.display_name ORDER BY a.actor_id""").fetchall()
    return [ActorRow(r[0], r[1], r[2], tuple(r[3])) for r in rows]
