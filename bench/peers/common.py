"""The harness shared by every driver: fresh databases, worker processes, effects, timing.

A driver is a module with three functions:

    setup(dsn, n)                                   schema + enqueue n jobs (not timed)
    run_worker(dsn, worker_index, n, start_event)   prepare, `start_event.wait()`, drain;
                                                    returns the job ids its handler ran
    verify(dsn, n) -> dict                          counts from the queue's own tables;
                                                    must contain "queue_ok": bool

The handler of every system is a no-op that appends its job id to a per-process list;
the worker hands that list back and the harness writes it to the `effects` table with
one COPY per worker after every worker has finished draining (outside the timed window
and the WAL window, identical for every system), and checks exactly-once there:
count(*) = n and count(distinct job_id) = n.

WAL per item: the server's WAL insert position (`pg_current_wal_lsn()`) is read just
before the start barrier is released and again once every worker has reported, and
`pg_wal_lsn_diff` of the two over n is the run's WAL bytes per item. The position is
server-wide, so the systems run one at a time; the run also reports whether a
checkpoint began inside the window (the first change of each page after a checkpoint
logs a full page image, which would inflate the figure).
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import statistics
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from queue import Empty

import psycopg

from nexus_pipelines.local.postgres import drop_database, ensure_database, with_database

DRIVERS = {
    "nexus": "bench.peers.nexus_driver",
    "procrastinate": "bench.peers.procrastinate_driver",
    "pgqueuer": "bench.peers.pgqueuer_driver",
    "raw_skip_locked": "bench.peers.raw_skip_locked",
    "raw_lanes": "bench.peers.raw_lanes",
}


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def driver(system: str):
    return importlib.import_module(DRIVERS[system])


# --- effects ---------------------------------------------------------------------------

def create_effects_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS public.bench_effects (job_id bigint NOT NULL, worker int NOT NULL)")


def write_effects(dsn: str, worker_index: int, job_ids: list[int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        with cur.copy("COPY public.bench_effects (job_id, worker) FROM STDIN") as copy:
            for job_id in job_ids:
                copy.write_row((job_id, worker_index))


def effect_counts(dsn: str) -> tuple[int, int]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*), count(DISTINCT job_id) FROM public.bench_effects").fetchone()


# --- one worker process ----------------------------------------------------------------

def _worker_main(system: str, dsn: str, worker_index: int, n: int, start, results) -> None:
    try:
        handled = driver(system).run_worker(dsn, worker_index, n, start)
        finished = time.monotonic()  # CLOCK_MONOTONIC: comparable across processes on Linux
        results.put((worker_index, finished, handled, None))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the run
        results.put((worker_index, time.monotonic(), [], traceback.format_exc()))
        try:
            start.abort()  # a worker failing before the barrier must not hang the others
        except Exception:  # noqa: BLE001
            pass


def _first_error(results) -> str:
    try:
        return next(err for *_, err in iter(lambda: results.get(timeout=5), None) if err)
    except (Empty, StopIteration):
        return "(no error reported)"


# --- one timed run of one system ---------------------------------------------------------

@dataclass
class RunResult:
    system: str
    ok: bool = False
    wall_s: float | None = None
    jobs_per_s: float | None = None
    per_worker_jobs: list[int] = field(default_factory=list)
    effects: int | None = None
    distinct_effects: int | None = None
    queue: dict = field(default_factory=dict)
    wal_bytes: int | None = None
    wal_lsn_range: tuple[str, str] | None = None  # for pg_waldump --stats -s START -e END
    wal_bytes_per_item: float | None = None
    checkpoint_in_window: bool | None = None
    error: str | None = None


def wal_position(dsn: str) -> tuple[str, str]:
    """The server's WAL insert position and the redo position of its latest checkpoint."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT pg_current_wal_lsn()::text, redo_lsn::text FROM pg_control_checkpoint()").fetchone()


def wal_between(dsn: str, start_lsn: str, end_lsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (end_lsn, start_lsn)).fetchone()[0])


def run_once(
    system: str, server_dsn: str, n: int, workers: int, timeout_s: float, tag: str, **setup_options
) -> RunResult:
    """One timed, verified run; `setup_options` go to the driver's `setup` (a workload shape)."""
    result = RunResult(system)
    dbname = f"bench_wq_{system}_{tag}"
    drop_database(server_dsn, dbname)
    ensure_database(server_dsn, dbname)
    dsn = with_database(server_dsn, dbname)
    ctx = mp.get_context("spawn")
    procs: list = []
    try:
        create_effects_table(dsn)
        t = time.monotonic()
        driver(system).setup(dsn, n, **setup_options)
        log(f"{system}: enqueued {n} jobs in {time.monotonic() - t:.1f}s (not timed); starting {workers} worker(s)")
        start = ctx.Barrier(workers + 1)
        results = ctx.Queue()
        procs = [
            ctx.Process(target=_worker_main, args=(system, dsn, i, n, start, results), name=f"{system}-{i}")
            for i in range(workers)
        ]
        for proc in procs:
            proc.start()
        wal_start, redo_start = wal_position(dsn)
        try:
            start.wait(timeout=120)  # every worker is connected and ready
        except threading.BrokenBarrierError:
            raise RuntimeError(f"{system} worker failed before the start:\n{_first_error(results)}") from None
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        reports = []
        while len(reports) < workers:
            try:
                report = results.get(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            except Empty:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{system} did not finish {n} jobs within {timeout_s:.0f}s") from None
                if not any(p.is_alive() for p in procs) and results.empty():
                    raise RuntimeError(f"{system} workers exited without reporting") from None
                continue
            if report[3]:
                raise RuntimeError(f"{system} worker {report[0]} failed:\n{report[3]}")
            reports.append(report)
        result.wall_s = max(finished for _, finished, _, _ in reports) - t0
        wal_end, redo_end = wal_position(dsn)
        result.wal_bytes = wal_between(dsn, wal_start, wal_end)
        result.wal_lsn_range = (wal_start, wal_end)
        result.wal_bytes_per_item = round(result.wal_bytes / n, 1)
        result.checkpoint_in_window = redo_end != redo_start
        result.jobs_per_s = n / result.wall_s
        result.per_worker_jobs = [len(handled) for _, _, handled, _ in sorted(reports)]
        for proc in procs:
            proc.join(timeout=30)
        for worker_index, _, handled, _ in reports:
            write_effects(dsn, worker_index, handled)
        result.effects, result.distinct_effects = effect_counts(dsn)
        result.queue = driver(system).verify(dsn, n)
        result.ok = result.effects == n and result.distinct_effects == n and bool(result.queue.get("queue_ok"))
        if not result.ok:
            result.error = "verification failed"
    except BaseException as exc:  # noqa: BLE001 - a failed system is reported, not fatal
        result.error = f"{exc.__class__.__name__}: {exc}"
        if isinstance(exc, KeyboardInterrupt):
            raise
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=10)
        try:
            drop_database(server_dsn, dbname)
        except Exception as exc:  # noqa: BLE001
            log(f"{system}: could not drop {dbname}: {exc}")
    return result


def summarize(system: str, runs: list[RunResult]) -> dict:
    """Median throughput and wall time over the runs; verified only when every run verified."""
    verified = bool(runs) and all(r.ok for r in runs)
    return {
        "system": system,
        "verified": verified,
        "jobs_per_s": round(statistics.median(r.jobs_per_s for r in runs), 1) if verified else None,
        "wall_s": round(statistics.median(r.wall_s for r in runs), 3) if verified else None,
        "wal_bytes_per_item": round(statistics.median(r.wal_bytes_per_item for r in runs), 1) if verified else None,
        "runs": [asdict(r) for r in runs],
    }
