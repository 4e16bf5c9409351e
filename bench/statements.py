"""Where a first sync's database time goes: the costliest statements of its poll, routing and drain.

    python bench/statements.py [--provider gitlab|github|jira] [--issues 10000] [--top 8]

Runs the first sync of `bench/polling.py` (the same world, page size and drain: the poll page
by page, the database analyzed, the routing, the drain to an empty queue) against a fresh
durable embedded Postgres that loads `pg_stat_statements` (or the server of NEXUS_PG_DSN,
which must load it), and reads the extension's counters and the server's WAL position around
each phase. For each phase it prints its wall time, its WAL bytes per issue and its costliest
statements: calls, execution time, shared buffers touched and WAL bytes, each per issue, and
the statement's opening words. A statement's time is the server's execution of it: planning,
the network, waits in the client and the commit's flush are not in it, so a phase's
statements add up to less than its wall time.

Progress goes to stderr; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.polling import DRAIN_BUDGET_S, PROVIDERS, bench_database, drain_all, plant_world  # noqa: E402
from bench.server import bench_server  # noqa: E402

EXTENSION = "pg_stat_statements"

# this database's statements, costliest first, with their counters (time in ms, WAL in bytes)
_STATEMENTS = """
SELECT regexp_replace(query, '\\s+', ' ', 'g'), calls, total_exec_time, shared_blks_hit + shared_blks_read, wal_bytes
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_current_wal_lsn%'
 ORDER BY total_exec_time DESC
"""


class MissingExtension(SystemExit):
    """The server does not load pg_stat_statements; the message says how to fix it."""


def _reset(conn) -> str:
    """Zero the counters; the WAL position to measure the phase's WAL from."""
    conn.execute("SELECT pg_stat_statements_reset()")
    return conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


def _phase(conn, name: str, started_lsn: str, wall_s: float, issues: int, top: int) -> dict:
    (wal,) = conn.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (started_lsn,)).fetchone()
    rows = conn.execute(_STATEMENTS).fetchall()
    statements = [{"statement": text[:100], "calls": calls, "us_per_issue": round(ms * 1000 / issues, 1),
                   "buffers_per_issue": round(buffers / issues, 1), "wal_bytes_per_issue": round(wal_bytes / issues)}
                  for text, calls, ms, buffers, wal_bytes in rows]
    return {"phase": name, "wall_s": round(wall_s, 2), "wal_bytes_per_issue": round(int(wal) / issues),
            "statements_us_per_issue": round(sum(s["us_per_issue"] for s in statements), 1),
            "statements": statements[:top]}


def _enable(dsn: str) -> None:
    from nexus_pipelines.control.db import connect

    with connect(dsn) as conn:
        (loaded,) = conn.execute(
            "SELECT %s = ANY(regexp_split_to_array(current_setting('shared_preload_libraries'), '\\s*,\\s*'))",
            (EXTENSION,)).fetchone()
        if not loaded:
            raise MissingExtension(f"bench: the server does not load {EXTENSION}; add it to shared_preload_libraries "
                                   "and restart it, or unset NEXUS_PG_DSN to use an embedded server")
        conn.execute(f"CREATE EXTENSION IF NOT EXISTS {EXTENSION}")


def run(admin: str, provider: str, issues: int, top: int) -> dict:
    from nexus_pipelines.connectors.core.tick import poll
    from nexus_pipelines.connectors.registry import REGISTRY
    from nexus_pipelines.local.worlds.plant import executor

    dsn, pool = bench_database(admin, f"bench_statements_{provider}")
    _enable(dsn)
    world, operation_of = PROVIDERS[provider](issues)
    plant, _ = plant_world(pool, world, operation_of)
    registration = world.registration(key="bench", page_size=100)
    plant.activate(registration)
    rid = registration.registration_id
    phases = []
    with pool.connection() as conn:
        def measured(name, work):
            print(f"bench: {name}...", file=sys.stderr, flush=True)
            lsn = _reset(conn)
            started = time.perf_counter()
            work()
            phases.append(_phase(conn, name, lsn, time.perf_counter() - started, issues, top))

        measured("poll", lambda: poll(conn, REGISTRY, plant.composer, owner="bench", executor=executor(),
                                      registration_ids=[rid], time_budget_s=DRAIN_BUDGET_S))
        conn.execute("ANALYZE")  # as bench/polling.py does by default, and autovacuum would have by then
        measured("route", plant.route)
        measured("drain", lambda: drain_all(pool, plant.registry(), rid, "first sync"))
    pool.close()
    return {"provider": provider, "issues": issues, "phases": phases}


def _print_table(result: dict) -> None:
    for phase in result["phases"]:
        print(f"{phase['phase']:6} {phase['wall_s']:7.2f} s  {phase['wal_bytes_per_issue']:6,} B WAL/issue  "
              f"statements {phase['statements_us_per_issue']:7.1f} us/issue")
        for s in phase["statements"]:
            print(f"  {s['us_per_issue']:7.1f} us  {s['buffers_per_issue']:5.1f} buf  {s['wal_bytes_per_issue']:6,} B  "
                  f"x{s['calls']:<5} {s['statement'][:70]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--provider", choices=sorted(PROVIDERS), default="gitlab")
    parser.add_argument("--issues", type=int, default=10_000)
    parser.add_argument("--top", type=int, default=8, help="statements shown per phase")
    args = parser.parse_args()

    with bench_server("statements", shared_preload_libraries=EXTENSION) as (admin, _):
        result = run(admin, args.provider, args.issues, args.top)
    _print_table(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
