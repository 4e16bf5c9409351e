"""pgqueuer through its public API: Queries + QueueManager over a psycopg async connection.

Schema via `Queries.install()` (what `pgq install` runs; default durability "durable",
so every table is logged like the others'), jobs via one batched `Queries.enqueue` with
lists, workers via `QueueManager.run(mode=drain)`: each worker exits once nothing is
queued and its in-flight jobs are logged, with `batch_size` BATCH_SIZE (best found)
and a short `dequeue_timeout`. Done jobs leave the queue table and are logged as
'successful' in pgqueuer_log, which is what verify() reads.

Quirk (pgqueuer 1.6 + psycopg 3.3, asyncpg not installed): PsycopgDriver runs LISTEN
and every query on one connection, and its notify watcher holds that connection in
`notifies(timeout=1.0)`; once the queue is empty and no NOTIFY arrives, each of the
drain loop's last queries waits out that second, so a drain ends ~2-4 s after its last
job. The headline wall time (to worker exit, as for every system) includes that tail;
`db_span_s` (first pick to last completion on the database clock) shows the rate
without it.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta

import psycopg
from pgqueuer import PsycopgDriver, Queries, QueueManager
from pgqueuer.types import QueueExecutionMode

BATCH_SIZE = int(os.environ.get("BENCH_PGQUEUER_BATCH_SIZE", "500"))
DEQUEUE_TIMEOUT = timedelta(milliseconds=50)
OPTIONS = {"batch_size": BATCH_SIZE, "dequeue_timeout_s": DEQUEUE_TIMEOUT.total_seconds(), "mode": "drain"}
ENTRYPOINT = "bench_noop"
ENQUEUE_CHUNK = 5000


async def _connect(dsn: str) -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True)


def setup(dsn: str, n: int) -> None:
    async def go():
        async with await _connect(dsn) as conn:
            queries = Queries(PsycopgDriver(conn))
            await queries.install()
            for start in range(0, n, ENQUEUE_CHUNK):
                size = min(ENQUEUE_CHUNK, n - start)
                await queries.enqueue([ENTRYPOINT] * size, [None] * size, [0] * size)

    asyncio.run(go())


def run_worker(dsn: str, worker_index: int, n: int, start_event) -> list[int]:
    handled: list[int] = []

    async def go():
        async with await _connect(dsn) as conn:
            qm = QueueManager(Queries(PsycopgDriver(conn)))

            @qm.entrypoint(ENTRYPOINT)
            async def noop(job) -> None:
                handled.append(job.id)

            await asyncio.to_thread(start_event.wait)
            await qm.run(dequeue_timeout=DEQUEUE_TIMEOUT, batch_size=BATCH_SIZE, mode=QueueExecutionMode.drain)

    asyncio.run(go())
    return handled


def verify(dsn: str, n: int) -> dict:
    with psycopg.connect(dsn) as conn:
        left = conn.execute("SELECT count(*) FROM pgqueuer").fetchone()[0]
        ok_logs, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT job_id) FROM pgqueuer_log WHERE status = 'successful'"
        ).fetchone()
        # DB clock: first pick to last 'successful' log entry (see the module docstring).
        span = conn.execute(
            "SELECT extract(epoch FROM max(created) FILTER (WHERE status = 'successful')"
            " - min(created) FILTER (WHERE status = 'picked')) FROM pgqueuer_log"
        ).fetchone()[0]
        joined = conn.execute(
            "SELECT count(*) FROM public.bench_effects e"
            " JOIN pgqueuer_log l ON l.job_id = e.job_id AND l.status = 'successful'"
        ).fetchone()[0]
    return {
        "left_in_queue": left,
        "logged_successful": ok_logs,
        "effects_matching_jobs": joined,
        "db_span_s": round(float(span), 3),
        "queue_ok": left == 0 and ok_logs == n and distinct == n and joined == n,
    }
