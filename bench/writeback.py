"""Writeback benchmark: is the NexusCRM API the bottleneck?

    python bench/writeback.py --rows 100000 --latency-ms 200

Seeds N Month End ARR rows in a BigQuery emulator (its own process), serves the
NexusCRM simulator over HTTP from another process with L ms added per call, runs
`month_end_arr` through the runner against a fresh embedded Postgres control plane
(or NEXUS_PG_DSN), then reruns it unchanged. Prints per-stage times and, as the last
line of stdout, one JSON object.

Peak RSS is this process only (the runner); the emulator, the simulator and Postgres
run in their own processes, as BigQuery, NexusCRM and the control plane would. The
validation pass is reported per row as wall time, as CPU time of the thread that maps
and hashes, and as CPU time of the whole process (the page reads on the prefetch thread
included); the load average at the start and the end says how busy the machine was, and
`cpu_steal_pct` how much of its CPU time the host gave other guests during the first run.

The first run's control-plane cost is reported per batch commit (the run's totals over
its batches, so the few writes outside the batches count too): WAL bytes (from
pg_current_wal_lsn() around the run), WAL records and full-page images (pg_stat_wal),
WAL writes and fsyncs and their times in ms (pg_stat_io; the bench's own server has
track_wal_io_timing on) and committed transactions of the bench's database
(pg_stat_database; read-only ones count too, such as the lease check before each batch).
They cover the whole server, so with NEXUS_PG_DSN another client's
writes count too; `pg_data_dir` says where the bench put its database (removed, with the
emulator's files, when the bench ends). The batch commits run on a commit thread while
the next batch is in flight: `ledger_writes_s` is their own time, `ledger_wait_s` the
part of it the write pass waited for. `ledger_commit_p50/p95_ms` time each commit on the commit
thread (the round trip, the WAL flush and every wait for a CPU or the interpreter lock
included); `ledger_commit_db_p50/p95_ms` time the same statements on the database clock,
from their start to their last write, so the two apart say whether a slow commit was the
database's work or the host's.

`run_over_api` is the first run's wall time over its time in CRM calls (the preflight's
authentication and describe, upserts and read-backs);
`run_over_api_without_pre_write_warehouse` leaves out the BigQuery waits before the write
pass (`pre_write_warehouse_s`), which no CRM call can overlap.

The runner reads the candidates with the BigQuery Storage Read API on the emulator's
gRPC endpoint (`--read storage`, as in production), or with keyset-paged queries
(`--read queries`, the path without a read client or when the API is refused).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.host import Steal  # noqa: E402 - the project root is on the path from here


def _serve_simulator(latency_s: float, conn) -> None:
    """Simulator process: serve over HTTP, answer 'calls' and 'stop' over the pipe."""
    from nexus_pipelines.local.simulators.http import serve_in_thread
    from nexus_pipelines.local.simulators.nexuscrm import NexusCrmState, build_nexuscrm_app
    from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper

    state = NexusCrmState(latency_s=latency_s, api_limit=10_000_000)
    state.define_object_from_contract(MonthEndArrMapper.TARGET_OBJECT, MonthEndArrMapper.FIELDS)
    url, stop = serve_in_thread(build_nexuscrm_app(state))
    conn.send((url, state.client_id, state.client_secret))
    while True:
        command = conn.recv()
        if command == "calls":
            conn.send(state.calls())
        elif command == "records":
            conn.send(len(state.records("Month_End_ARR__c")))
        else:
            stop()
            conn.send("stopped")
            return


def _serve_emulator(data_dir: str, conn) -> None:
    """Emulator process: serve REST and gRPC, send both endpoints, stop on any message."""
    from nexus_pipelines.local.bigquery_emulator import InProcessEmulator

    Path(data_dir).mkdir(parents=True)
    log = os.open(Path(data_dir) / "emulator.log", os.O_WRONLY | os.O_CREAT)
    os.dup2(log, 1)  # its warnings stay out of the bench's output
    os.dup2(log, 2)
    emulator = InProcessEmulator(Path(data_dir))
    rest_url = emulator.start()
    conn.send((rest_url, emulator._server.grpc_endpoint))  # the launcher publishes no gRPC port
    conn.recv()
    emulator.stop()
    conn.send("stopped")


def _stop(end) -> None:
    """Ask a served process to stop and wait for its answer; one already gone needs nothing."""
    try:
        end.send("stop")
        end.recv()
    except (OSError, EOFError):
        pass


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(math.ceil(q * len(ordered))) - 1)]


_WAL_COUNTERS = """
SELECT pg_current_wal_lsn()::text, w.wal_records, w.wal_fpi,
       (SELECT coalesce(sum(writes), 0) FROM pg_stat_io WHERE object = 'wal'),
       (SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal'),
       (SELECT coalesce(sum(write_time), 0) FROM pg_stat_io WHERE object = 'wal'),
       (SELECT coalesce(sum(fsync_time), 0) FROM pg_stat_io WHERE object = 'wal'),
       (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())
  FROM pg_stat_wal w
"""
# the WAL write and fsync times (ms) count only while track_wal_io_timing is on, as the bench's
# own server has it; a NEXUS_PG_DSN server without it reports 0
_WAL_KEYS = ("wal_bytes", "wal_records", "wal_fpi", "wal_writes", "wal_fsyncs", "wal_write_ms", "wal_fsync_ms",
             "commits")


def _wal_counters(dsn: str) -> dict:
    """Server-wide WAL counters; a fresh connection, so every other backend's stats have
    been flushed by then (a backend flushes them when it exits or idles for a second)."""
    from nexus_pipelines.control.db import connect

    time.sleep(1.1)
    with connect(dsn) as conn:
        row = conn.execute(_WAL_COUNTERS).fetchone()
        lsn = conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, '0/0')", (row[0],)).fetchone()[0]
    return dict(zip(_WAL_KEYS, [float(lsn), *(float(x) for x in row[1:])], strict=True))


def _per_commit(before: dict, after: dict, batches: int) -> dict:
    n = max(batches, 1)
    return {f"{key}_per_batch_commit": round((after[key] - before[key]) / n, 2)
            for key in _WAL_KEYS}


def _run(runner, context) -> tuple:
    """Run to the end; returns (result, validation main-thread CPU s, validation process CPU s,
    BigQuery wait before the write pass s)."""
    from nexus_pipelines.writeback.contract import JobResult
    from nexus_pipelines.writeback.runner import STAGE_KEYS, STAGE_VALIDATION, StageDone

    result, marks = None, {}
    for event in runner.execute(context):
        if isinstance(event, StageDone) and event.stage in (STAGE_KEYS, STAGE_VALIDATION):
            marks[event.stage] = (time.thread_time(), time.process_time(), runner.warehouse.seconds)
        elif isinstance(event, JobResult):
            result = event
    (thread0, process0, _), (thread1, process1, warehouse) = marks[STAGE_KEYS], marks[STAGE_VALIDATION]
    return result, thread1 - thread0, process1 - process0, warehouse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--page-size", type=int, default=5000)
    parser.add_argument("--prefetch-pages", type=int, default=2, help="0 reads pages inline, between batches")
    parser.add_argument("--read", choices=("storage", "queries"), default="storage",
                        help="read the candidates with the Storage Read API or with keyset-paged queries")
    args = parser.parse_args()

    from nexus_pipelines.control.db import connect
    from nexus_pipelines.control.migrations import apply_migrations
    from nexus_pipelines.integrations.bigquery import make_bigquery_client
    from nexus_pipelines.local.postgres import DURABLE_SETTINGS, EmbeddedPostgres, ensure_database, with_database
    from nexus_pipelines.settings import PROJECT_ROOT
    from nexus_pipelines.writeback.config import parse_config
    from nexus_pipelines.writeback.contract import JobContext
    from nexus_pipelines.local.month_end_arr_source import seed_source
    from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper
    from nexus_pipelines.writeback.runner import STAGE_CRM, STAGE_PREFLIGHT, Runner
    from nexus_pipelines.writeback.source import emulator_read_client

    def say(line: str) -> None:
        print(line, flush=True)

    load_start = [round(x, 2) for x in os.getloadavg()]
    work = Path(tempfile.mkdtemp(prefix="wb_bench_"))
    postgres = None
    if os.environ.get("NEXUS_PG_DSN"):
        admin = os.environ["NEXUS_PG_DSN"]
    else:
        # durable settings (commits wait for the WAL flush), with the flush's writes and fsyncs timed
        postgres = EmbeddedPostgres(work / "pg", settings={**DURABLE_SETTINGS, "track_wal_io_timing": "on"})
        admin = postgres.start().dsn()
    dbname = f"wb_bench_{uuid.uuid4().hex[:8]}"
    ensure_database(admin, dbname)
    dsn = with_database(admin, dbname)
    apply_migrations(dsn)
    ctx = multiprocessing.get_context("spawn")
    emulator_end, emulator_child = ctx.Pipe()
    emulator = ctx.Process(target=_serve_emulator, args=(str(work / "bq"), emulator_child), daemon=True)
    emulator.start()
    bq_url, grpc_endpoint = emulator_end.recv()
    storage = emulator_read_client(grpc_endpoint) if args.read == "storage" else None
    parent, child = ctx.Pipe()
    simulator = ctx.Process(target=_serve_simulator, args=(args.latency_ms / 1000.0, child), daemon=True)
    simulator.start()
    sim_url, client_id, client_secret = parent.recv()
    os.environ.update({"NEXUSCRM_BASE_URL": sim_url, "NEXUSCRM_CLIENT_ID": client_id,
                       "NEXUSCRM_CLIENT_SECRET": client_secret})
    try:
        bq = make_bigquery_client("nexus-bench", "US", bq_url)
        dataset = "bench_src"
        t = time.perf_counter()
        seed_source(bq, dataset, args.rows)
        say(f"seeded {args.rows} rows in {time.perf_counter() - t:.1f}s; CRM latency {args.latency_ms:.0f} ms/call")
        data = {
            "version": 1,
            "source": {"project": "nexus-bench", "location": "US", "sql_file": "../../sql/jobs/month_end_arr.sql",
                       "readiness_sql_file": "../../sql/jobs/month_end_arr-readiness.sql",
                       "freshness_max_age_minutes": 600, "sql_vars": {"source_dataset": dataset}},
            "target": {"base_url_env": "NEXUSCRM_BASE_URL", "api_version": "v63.0",
                       "client_id_env": "NEXUSCRM_CLIENT_ID", "client_secret_env": "NEXUSCRM_CLIENT_SECRET",
                       "local_mode": True},
            "state": {"project": "nexus-bench", "dataset": "nexuscrm_control"},
            "write": {"batch_size": 200, "delete_policy": "ignore", "max_attempts": 5},
            "schedule": {"cron": "0 3 * * *", "timezone": "UTC", "paused": True},
        }
        loaded = parse_config(data, base_dir=PROJECT_ROOT / "configs" / "jobs")
        runs = []
        wal_before = _wal_counters(dsn)
        for label in ("first", "rerun"):
            from datetime import UTC, datetime

            with connect(dsn) as conn:
                runner = Runner("month_end_arr", MonthEndArrMapper(), loaded, bq=bq, conn=conn, storage=storage,
                                page_size=args.page_size, prefetch_pages=args.prefetch_pages)
                t, steal = time.perf_counter(), Steal()
                result, cpu_thread, cpu_process, pre_write_warehouse = _run(runner, JobContext(
                    run_id=f"bench-{label}-{uuid.uuid4().hex[:6]}", started_at=datetime.now(UTC), dry_run=False))
                wall, stolen = time.perf_counter() - t, steal.pct()
            runs.append((label, result, runner, wall, cpu_thread, cpu_process, pre_write_warehouse, stolen))
            say(f"{label}: {result.status} selected={result.selected} unchanged={result.unchanged} "
                f"succeeded={result.succeeded} failed={result.retryable_failed + result.permanently_failed} "
                f"batches={result.batches} crm_calls={result.crm_calls} read_back_calls={result.read_back_calls} "
                f"wall={wall:.2f}s "
                f"warehouse_read={runner.warehouse.seconds:.2f}s ({runner.warehouse.queries} queries)")
            for stage, seconds in result.stage_seconds.items():
                say(f"  {stage:<18} {seconds:8.3f}s")
            for what, commits in (("ledger commit per batch", runner.ledger_commit_ms),
                                  ("  its statement on the database clock", runner.ledger_commit_db_ms)):
                if commits:
                    say(f"  {what}: p50={_pct(commits, 0.5):.2f} ms p95={_pct(commits, 0.95):.2f} ms "
                        f"max={max(commits):.2f} ms over {len(commits)} batches")
            if label == "first":
                wal = _per_commit(wal_before, _wal_counters(dsn), result.batches)
                say("  per batch commit: " + " ".join(f"{k}={v}" for k, v in wal.items()))
        parent.send("records")
        crm_records = parent.recv()
        _, first, first_runner, first_wall, cpu_thread, cpu_process, pre_write_warehouse, first_steal = runs[0]
        _, rerun, _, rerun_wall, _, _, _, _ = runs[1]
        # Every CRM call is API time: the preflight's (authentication, describe) and the write pass's.
        crm_s = sum(first.stage_seconds.get(stage, 0.0) for stage in (STAGE_PREFLIGHT, STAGE_CRM))
        per_row_us = 1e6 / max(first.selected, 1)
        changed = first.would_write
        # BigQuery time on the critical path: every stage before the write pass waits on it;
        # in the write pass the next page is read on a prefetch thread while the CRM call runs.
        summary = {
            "rows": args.rows,
            "read": args.read,
            "changed": changed,
            "calls": first.crm_calls,
            "read_back_calls": first.read_back_calls,  # first-time creates read back by external id
            "min_calls": math.ceil(changed / 200),
            "latency_ms": args.latency_ms,
            "total_s": round(first_wall, 3),
            "warehouse_read_s": round(first_runner.warehouse.seconds, 3),
            "ledger_commit_p50_ms": round(_pct(first_runner.ledger_commit_ms, 0.5), 3),
            "ledger_commit_p95_ms": round(_pct(first_runner.ledger_commit_ms, 0.95), 3),
            # the same commits' statements timed by the database (no trips, no flush, no waits on the host)
            "ledger_commit_db_p50_ms": round(_pct(first_runner.ledger_commit_db_ms, 0.5), 3),
            "ledger_commit_db_p95_ms": round(_pct(first_runner.ledger_commit_db_ms, 0.95), 3),
            "validation_us_per_row": round(first.stage_seconds.get("validation_pass", 0.0) * per_row_us, 1),
            "validation_cpu_us_per_row": round(cpu_thread * per_row_us, 1),
            "validation_process_cpu_us_per_row": round(cpu_process * per_row_us, 1),
            "load_average_start": load_start,
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "cpu_steal_pct": first_steal,  # the host's share of the machine's CPU time in the first run
            "unchanged_rerun_calls": rerun.crm_calls,
            "unchanged_rerun_read_back_calls": rerun.read_back_calls,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "crm_records": crm_records,
            "first_status": first.status,
            "rerun_status": rerun.status,
            "rerun_total_s": round(rerun_wall, 3),
            "crm_calls_s": round(crm_s, 3),
            # Run time over the time spent in CRM calls (preflight, upserts, read-backs); the second
            # leaves out the BigQuery waits before the write pass (readiness, candidate table,
            # key checks, the validation pass's page reads), which no CRM call can overlap.
            "run_over_api": round(first_wall / max(crm_s, 1e-9), 4),
            "run_over_api_without_pre_write_warehouse": round((first_wall - pre_write_warehouse) / max(crm_s, 1e-9), 4),
            "pre_write_warehouse_s": round(pre_write_warehouse, 3),
            # The batch commits' own time (on the commit thread) and the part of it the write
            # pass waited for (the rest ran while the next batch was in flight).
            "ledger_writes_s": round(first.stage_seconds.get("ledger_writes", 0.0), 3),
            "ledger_wait_s": round(first.stage_seconds.get("ledger_wait", 0.0), 3),
            "validation_pass_s": round(first.stage_seconds.get("validation_pass", 0.0), 3),
            "pg_data_dir": str(postgres.data_dir) if postgres is not None else "NEXUS_PG_DSN",
            **wal,
        }
        budget = 1.10 * (summary["calls"] + summary["read_back_calls"]) * args.latency_ms / 1000
        # Only the waits before the write pass: its page reads overlap the CRM calls.
        say(f"time outside the BigQuery waits before the write pass {first_wall - pre_write_warehouse:.2f}s vs "
            f"1.10 x (calls + read-back calls) x latency = {budget:.2f}s")
        print(json.dumps(summary, sort_keys=True), flush=True)
        return 0
    finally:
        _stop(parent)
        simulator.join(timeout=10)
        if storage is not None:
            storage.transport.close()
        _stop(emulator_end)
        emulator.join(timeout=30)
        if postgres is not None:
            postgres.stop()
        shutil.rmtree(work, ignore_errors=True)  # a 100,000-row run leaves about 250 MB


if __name__ == "__main__":
    sys.exit(main())
