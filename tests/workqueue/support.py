"""Helpers for the work queue tests that coordinate several connections."""

from __future__ import annotations

import time

from psycopg import Connection


def wait_until_blocked(observer: Connection, blocked: Connection, timeout_s: float = 10.0) -> None:
    """Wait until `blocked`'s backend is waiting for a lock (its statement runs in another thread)."""
    pid = blocked.info.backend_pid
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = observer.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        if row and row[0] == "Lock":
            return
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited for a lock")


def work_ids(conn: Connection, reg: str) -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT work_id FROM connector_work_items WHERE registration_id = %s ORDER BY work_id", (reg,)
    )]


def take(conn: Connection, work_id: int, owner: str = "other") -> int:
    """Mark an item running for `owner` (as that owner's committed claim would); returns its token."""
    (token,) = conn.execute(
        """UPDATE connector_work_items SET state = 'running', lease_owner = %s, lease_token = nextval('workqueue_tokens'),
                  lease_until = now() + interval '1 minute', attempts = attempts + 1
            WHERE work_id = %s RETURNING lease_token""",
        (owner, work_id),
    ).fetchone()
    return token


def wait_for_statement_blocked(observer: Connection, fragment: str, timeout_s: float = 10.0) -> int:
    """Wait until a backend of this database runs a statement containing `fragment` and waits
    for a lock; returns its pid."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = observer.execute(
            """SELECT pid FROM pg_stat_activity
                WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, %s) > 0
                  AND pid <> pg_backend_pid()""",
            (fragment,),
        ).fetchone()
        if row:
            return row[0]
        time.sleep(0.01)
    raise AssertionError(f"no statement with {fragment!r} ever waited for a lock")
