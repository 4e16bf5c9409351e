"""Page sessions: sign-in with the actor credential yields a random session token for an
HttpOnly cookie; the table keeps only the token's sha256 (a 32-byte random token needs no
slow hash). A session is valid while unexpired, not ended and its credential unrevoked,
so reissuing a credential signs its sessions out.

The CSRF token of a session is an HMAC of the fixed label under the session token: the
server recomputes it on every post and stores nothing more.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from psycopg import Connection

from nexus_pipelines.actors.store import Principal, authenticate

SESSION_TTL = timedelta(hours=12)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def start(conn: Connection, credential: str, *, ttl: timedelta = SESSION_TTL) -> tuple[str, Principal]:
    """Authenticate (raises AuthenticationFailed) and open a session; returns its token."""
    principal = authenticate(conn, credential)
    token = secrets.token_urlsafe(32)
    conn.execute(
        """INSERT INTO actor_sessions (session_hash, actor_id, credential_id, expires_at)
           VALUES (%s, %s, %s, clock_timestamp() + %s)""",
        (_digest(token), principal.actor_id, principal.credential_id, ttl))
    return token, principal


def resolve(conn: Connection, token: str | None) -> Principal | None:
    if not token or len(token) > 100:
        return None
    row = conn.execute(
        """SELECT s.actor_id, s.credential_id FROM actor_sessions s
             JOIN actor_credentials c USING (credential_id)
            WHERE s.session_hash = %s AND s.ended_at IS NULL AND s.expires_at > clock_timestamp()
              AND c.revoked_at IS NULL""",
        (_digest(token),)).fetchone()
    return Principal(*row) if row else None


def end(conn: Connection, token: str) -> None:
    conn.execute("UPDATE actor_sessions SET ended_at = clock_timestamp() WHERE session_hash = %s"
                 " AND ended_at IS NULL", (_digest(token),))


def csrf_token(session_token: str) -> str:
    return hmac.new(session_token.encode(), b"nexus-pages-csrf", hashlib.sha256).hexdigest()


def csrf_ok(session_token: str, submitted: str | None) -> bool:
    return bool(submitted) and hmac.compare_digest(csrf_token(session_token), submitted)
