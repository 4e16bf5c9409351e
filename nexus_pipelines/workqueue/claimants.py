"""The registry of running WorkItem drains (claim-capable processes).

A drain registers when it starts, renews its row while it runs and removes it when it
ends; a drain that dies leaves a row that expires. A rollback disables claims first
and then proves that every drain that was running at that moment has gone
(`running_since_before`): drains started later read the disabled gate before each
claim, and the ones from before have ended, so no running process can still hold an
admission from before the gate closed. Times are the database clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from psycopg import Connection


@dataclass(frozen=True)
class Claimant:
    claimant_id: str
    started_at: datetime
    expires_at: datetime


def register(conn: Connection, claimant_id: str, registration_ids: Sequence[str] | None, ttl: timedelta) -> None:
    conn.execute(
        """INSERT INTO workqueue_claimants (claimant_id, registration_ids, expires_at)
           VALUES (%s, %s, clock_timestamp() + %s)
           ON CONFLICT (claimant_id) DO UPDATE SET expires_at = EXCLUDED.expires_at""",
        (claimant_id, list(registration_ids) if registration_ids is not None else None, ttl),
    )


def renew(conn: Connection, claimant_id: str, ttl: timedelta) -> None:
    conn.execute(
        "UPDATE workqueue_claimants SET expires_at = clock_timestamp() + %s WHERE claimant_id = %s", (ttl, claimant_id)
    )


def deregister(conn: Connection, claimant_id: str) -> None:
    conn.execute("DELETE FROM workqueue_claimants WHERE claimant_id = %s", (claimant_id,))


def running_since_before(conn: Connection, registration_id: str, moment: datetime) -> list[Claimant]:
    """Live drains that may claim `registration_id` and were started before `moment`."""
    rows = conn.execute(
        """SELECT claimant_id, started_at, expires_at FROM workqueue_claimants
            WHERE expires_at > clock_timestamp() AND started_at < %s
              AND (registration_ids IS NULL OR %s = ANY(registration_ids))
            ORDER BY started_at""",
        (moment, registration_id),
    ).fetchall()
    return [Claimant(*r) for r in rows]


def prune_expired(conn: Connection) -> int:
    """Remove rows of drains that died (their leases, and so their claims, are long gone)."""
    return conn.execute("DELETE FROM workqueue_claimants WHERE expires_at <= clock_timestamp()").rowcount
