"""Fenced leases: one holder per lease name, judged by the database clock.

`acquire` succeeds when the lease is absent, expired, or already held by the same
owner, and every success hands out a new fencing token from one database sequence
(so tokens strictly increase). `take_over` replaces a holder the caller has proved dead (by its token) before the
lease expires. `renew` and `release` only act while the caller's
token is still the current one: a stale holder changes nothing. Writers that must
not act after losing a lease pass the token along and fence their writes with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from psycopg import Connection


class LeaseLost(RuntimeError):
    """The caller's fencing token is no longer the lease's current token."""


@dataclass(frozen=True)
class Lease:
    name: str
    owner_id: str
    token: int
    acquired_at: datetime
    expires_at: datetime


_ACQUIRE = """
INSERT INTO leases AS l (lease_name, owner_id, fencing_token, acquired_at, heartbeat_at, expires_at)
VALUES (%(name)s, %(owner)s, nextval('fencing_tokens'), clock_timestamp(), clock_timestamp(),
        clock_timestamp() + %(ttl)s)
ON CONFLICT (lease_name) DO UPDATE
   SET owner_id = EXCLUDED.owner_id,
       fencing_token = EXCLUDED.fencing_token,
       acquired_at = EXCLUDED.acquired_at,
       heartbeat_at = EXCLUDED.heartbeat_at,
       expires_at = EXCLUDED.expires_at
 WHERE l.expires_at <= clock_timestamp() OR l.owner_id = EXCLUDED.owner_id
RETURNING fencing_token, acquired_at, expires_at
"""

_RENEW = """
UPDATE leases
   SET heartbeat_at = clock_timestamp(), expires_at = clock_timestamp() + %(ttl)s
 WHERE lease_name = %(name)s AND fencing_token = %(token)s AND expires_at > clock_timestamp()
RETURNING expires_at
"""


def acquire(conn: Connection, name: str, owner_id: str, ttl: timedelta) -> Lease | None:
    """Take the lease, or return None while another owner holds an unexpired one."""
    row = conn.execute(_ACQUIRE, {"name": name, "owner": owner_id, "ttl": ttl}).fetchone()
    if row is None:
        return None
    token, acquired_at, expires_at = row
    return Lease(name, owner_id, token, acquired_at, expires_at)


_TAKE_OVER = """
UPDATE leases
   SET owner_id = %(owner)s, fencing_token = nextval('fencing_tokens'), acquired_at = clock_timestamp(),
       heartbeat_at = clock_timestamp(), expires_at = clock_timestamp() + %(ttl)s
 WHERE lease_name = %(name)s AND fencing_token = %(token)s
RETURNING fencing_token, acquired_at, expires_at
"""


def take_over(conn: Connection, name: str, owner_id: str, ttl: timedelta, token: int) -> Lease | None:
    """Take an unexpired lease from a holder the caller has proved dead, by its token: None
    when the token is no longer current (someone else took it first)."""
    row = conn.execute(_TAKE_OVER, {"name": name, "owner": owner_id, "ttl": ttl, "token": token}).fetchone()
    if row is None:
        return None
    new_token, acquired_at, expires_at = row
    return Lease(name, owner_id, new_token, acquired_at, expires_at)


def renew(conn: Connection, lease: Lease, ttl: timedelta) -> Lease:
    """Extend an unexpired lease held with `lease.token`; raises LeaseLost otherwise."""
    row = conn.execute(_RENEW, {"name": lease.name, "token": lease.token, "ttl": ttl}).fetchone()
    if row is None:
        raise LeaseLost(f"lease {lease.name!r} is no longer held with token {lease.token}: {describe(conn, lease.name)}")
    return Lease(lease.name, lease.owner_id, lease.token, lease.acquired_at, row[0])


def release(conn: Connection, lease: Lease) -> bool:
    """Give the lease up; False (and nothing changed) when the token is stale."""
    cur = conn.execute(
        "DELETE FROM leases WHERE lease_name = %s AND fencing_token = %s", (lease.name, lease.token)
    )
    return cur.rowcount == 1


def is_current(conn: Connection, lease: Lease) -> bool:
    """True while `lease.token` is the current, unexpired token (by the database clock)."""
    row = conn.execute(
        "SELECT 1 FROM leases WHERE lease_name = %s AND fencing_token = %s AND expires_at > clock_timestamp()",
        (lease.name, lease.token),
    ).fetchone()
    return row is not None


def describe(conn: Connection, name: str) -> str:
    row = conn.execute(
        "SELECT owner_id, fencing_token, expires_at <= clock_timestamp() FROM leases WHERE lease_name = %s", (name,)
    ).fetchone()
    if row is None:
        return "the lease is not held"
    owner, token, expired = row
    return f"now held by {owner!r} with token {token}" + (" (expired)" if expired else "")
