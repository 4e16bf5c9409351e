"""procrastinate through its public API: App + PsycopgConnector, one async worker per process.

Best settings found on 2 cores: an async task (no thread hop), worker concurrency
CONCURRENCY, listen/notify on and a short fetch polling interval, `delete_jobs`
left at its default ("never": rows stay for verification), wait=False so each worker
stops once it has caught up with the queue (every job is enqueued before the start).
"""

from __future__ import annotations

import asyncio
import os

import procrastinate

CONCURRENCY = int(os.environ.get("BENCH_PROCRASTINATE_CONCURRENCY", "10"))
OPTIONS = {"concurrency": CONCURRENCY, "fetch_job_polling_interval": 0.05, "delete_jobs": "never (default)"}
TASK = "bench_noop"
DEFER_CHUNK = 5000


def _app(dsn: str, handled: list[int] | None = None) -> procrastinate.App:
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=CONCURRENCY + 2)
    )

    @app.task(name=TASK, pass_context=True)
    async def noop(context: procrastinate.JobContext) -> None:
        handled.append(context.job.id)

    return app


def setup(dsn: str, n: int) -> None:
    async def go():
        app = _app(dsn)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            task = app.tasks[TASK]
            for start in range(0, n, DEFER_CHUNK):
                await task.batch_defer_async(*({} for _ in range(min(DEFER_CHUNK, n - start))))

    asyncio.run(go())


def run_worker(dsn: str, worker_index: int, n: int, start_event) -> list[int]:
    handled: list[int] = []

    async def go():
        app = _app(dsn, handled)
        async with app.open_async():
            await app.check_connection_async()
            await asyncio.to_thread(start_event.wait)
            await app.run_worker_async(
                name=f"bench-{worker_index}",
                concurrency=CONCURRENCY,
                wait=False,
                fetch_job_polling_interval=0.05,
                install_signal_handlers=False,
            )

    asyncio.run(go())
    return handled


def verify(dsn: str, n: int) -> dict:
    import psycopg

    with psycopg.connect(dsn) as conn:
        total, succeeded, distinct = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'succeeded'), count(DISTINCT id) FROM procrastinate_jobs"
        ).fetchone()
        span = conn.execute(
            "SELECT extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded') - min(at) FILTER (WHERE type = 'started'))"
            " FROM procrastinate_events"
        ).fetchone()[0]
        joined = conn.execute(
            "SELECT count(*) FROM public.bench_effects e JOIN procrastinate_jobs j ON j.id = e.job_id"
        ).fetchone()[0]
    return {
        "jobs": total,
        "succeeded": succeeded,
        "effects_matching_jobs": joined,
        "db_span_s": round(float(span), 3),
        "queue_ok": total == n and succeeded == n and distinct == n and joined == n,
    }
