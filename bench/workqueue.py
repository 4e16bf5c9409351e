"""Work-queue throughput: nexus vs procrastinate vs pgqueuer vs a raw SKIP LOCKED loop;
and, with --gates N, the time the rollback fence and the re-cutover take with N pending items.

    python bench/workqueue.py --items 20000 --workers 4 [--repeat 3] [--systems nexus,raw_skip_locked,raw_lanes]
    python bench/workqueue.py --gates 100000 [--with-event-path]

Each system drains N pre-enqueued no-op jobs with W spawned worker processes, in its own
fresh database on one Postgres server (NEXUS_PG_DSN, else an embedded server with
durable settings in a temp folder). Throughput = N / (wall time from the release of the
start barrier to the last worker finishing). Every run is verified in the database:
each job's handler ran exactly once and the queue itself shows every job done.
Each run also reports its WAL bytes per item (the server's WAL position around the
run, `bench/peers/common.py`). With both systems measured, `nexus_vs_raw` is nexus's
throughput over the raw claim-100 loop's (`bench/peers/raw_skip_locked.py`): the median,
over the --repeat rounds, of each round's ratio (a round runs nexus, then raw, back to
back). `nexus_vs_raw_lanes` is the same against plain SQL that keeps nexus's lane and
fencing rules on the same workload (`bench/peers/raw_lanes.py`): what nexus adds to the
cost of its rules, where `nexus_vs_raw` also counts what the rules themselves cost. The
raw loop's throughput swings by a factor of two between runs on a shared machine, so a
ratio of two medians taken at different times says little: use --repeat 3 or more.
Progress goes to stderr; the last line of stdout is one JSON object.

Fairness row (nexus measured, --hot-items H > 0, 10,000 by default): in each round, beside
the systems' runs, nexus drains the same N items again with H more enqueued in front of
them that all write one hot target lane (one running at a time); a round's slowdown is
1 - (the other lanes' throughput with the hot lane) / (their throughput without it, the
round's plain nexus run), both counted on the database clock from the first claim to the
last other-lane item finishing, and `fairness_slowdown` is the median over the rounds.
The hot run goes after the systems' runs in odd rounds and before them in even ones, so
a drift over the rounds (a warming cache, a neighbour) favours neither side. Identical
plain runs differ by nearly a factor of two (their claims read 36 to 78 shared buffers
per item: how much of a walk passes over other drains' items varies from run to run), so
the row needs --repeat 7 or more to tell a 10% slowdown from noise.

--gates N times, each on N pending items with source and target lanes, in a database of
its own: the rollback (claims disabled, then the fence transaction that fences every item
and hands the generation to the Event path) and the re-cutover of an Event-owned
generation whose N Event executions are pending (Event admission stopped, then the
cutover that makes them N work items). Both are verified in the database. With
--with-event-path the fenced generation's N items then run through the Event path
(one ordered consumer) and the re-cutover that verifies N reconciled fenced items is
timed too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from bench.peers.common import DRIVERS, driver, log, run_once, summarize  # noqa: E402
from bench.host import Steal  # noqa: E402
from bench.peers.gates import measure_gates  # noqa: E402
from bench.server import bench_server  # noqa: E402
from nexus_pipelines.control.db import safe_target  # noqa: E402


def _git_head() -> str | None:
    """The commit measured (the work queue changes under the benchmark)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True)
        return out.stdout.strip() or None
    except OSError:
        return None


def _gates(n: int, with_event_path: bool) -> int:
    with bench_server("workqueue") as (server_dsn, _):
        result = measure_gates(server_dsn, n, with_event_path=with_event_path)
    result.update(commit=_git_head(), cpus=os.cpu_count(), at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    print(json.dumps(result), flush=True)
    return 0 if result["verified"] else 1


def _pair_ratios(runs: dict[str, list], system: str, baseline: str) -> list[float] | None:
    """`system`'s throughput over `baseline`'s in each round (the two ran back to back)."""
    a, b = runs.get(system), runs.get(baseline)
    if not (a and b and all(r.ok for r in a + b)):
        return None
    return [round(x.jobs_per_s / y.jobs_per_s, 3) for x, y in zip(a, b)]


def _hot_run(server_dsn: str, args, k: int):
    """One nexus run with `args.hot_items` hot-target-lane items in front of the same items."""
    log(f"nexus fairness: run {k + 1}/{args.repeat}, {args.hot_items} hot-lane items + {args.items} others")
    run = run_once("nexus", server_dsn, args.items + args.hot_items, args.workers, args.timeout,
                   f"{os.getpid()}_hot{k}", hot=args.hot_items)
    log(f"nexus fairness: {'verified' if run.ok else 'FAILED: ' + str(run.error)}; "
        f"other lanes {run.queue.get('other_lanes_items_per_s')} items/s, all items {run.wall_s}s")
    return run


def _fairness(args, plain_runs: list, hot_runs: list) -> dict:
    """Each round's slowdown: its hot run's other-lane rate against its plain nexus run's."""
    rates = [(p.queue.get("other_lanes_items_per_s"), h.queue.get("other_lanes_items_per_s"))
             for p, h in zip(plain_runs, hot_runs) if p.ok and h.ok]
    slowdowns = [round(1 - with_hot / without, 3) for without, with_hot in rates if without and with_hot]
    verified = bool(hot_runs) and all(r.ok for r in hot_runs) and len(slowdowns) == len(hot_runs)
    return {
        "hot_items": args.hot_items,
        "other_items": args.items,
        "other_lanes_items_per_s_without_hot": [without for without, _ in rates],
        "other_lanes_items_per_s_with_hot": [with_hot for _, with_hot in rates],
        "fairness_slowdown": statistics.median(slowdowns) if verified else None,
        "fairness_slowdown_rounds": slowdowns,
        "all_items_wall_s_runs": [r.wall_s and round(r.wall_s, 2) for r in hot_runs],
        "wal_bytes_per_item_runs": [r.wal_bytes_per_item for r in hot_runs],
        "verified": verified,
        "errors": [r.error for r in hot_runs if r.error],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=20000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="rounds (one run per system each); the medians are reported")
    parser.add_argument("--systems", default=",".join(DRIVERS), help=f"comma-separated subset of {','.join(DRIVERS)}")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per system run before it fails")
    parser.add_argument("--hot-items", type=int, default=10000, metavar="H",
                        help="items of the fairness row's hot target lane (0: no fairness row)")
    parser.add_argument("--gates", type=int, default=None, metavar="N",
                        help="time the rollback fence and the re-cutover with N pending items instead")
    parser.add_argument("--with-event-path", action="store_true",
                        help="with --gates: also run the fenced items through the Event path and re-cut over")
    args = parser.parse_args(argv)
    if args.gates is not None:
        return _gates(args.gates, args.with_event_path)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(systems) - set(DRIVERS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; choose from {list(DRIVERS)}")
    if "raw_lanes" in systems and not driver("nexus").LANES:
        parser.error("raw_lanes keeps its lanes: with BENCH_NEXUS_LANES=0 leave it out of --systems")

    summaries: dict[str, dict] = {}
    commit = _git_head()
    load_start = round(os.getloadavg()[0], 2)  # the machine may be shared: context for the numbers
    steal = Steal()
    with bench_server("workqueue") as (server_dsn, _):
        log(f"Postgres server {safe_target(server_dsn)}")
        with psycopg.connect(server_dsn) as conn:
            server_version = conn.execute("SHOW server_version").fetchone()[0]
            fsync = conn.execute("SHOW fsync").fetchone()[0]
        # Round-robin over systems, so a noisy neighbour on a shared machine hits them alike.
        runs: dict[str, list] = {system: [] for system in systems}
        fair, hot_runs = "nexus" in systems and args.hot_items > 0, []
        for k in range(args.repeat):
            hot_first = fair and k % 2 == 1
            if hot_first:
                hot_runs.append(_hot_run(server_dsn, args, k))
            for system in systems:
                log(f"{system}: run {k + 1}/{args.repeat}, {args.items} items, {args.workers} worker(s)")
                run = run_once(system, server_dsn, args.items, args.workers, args.timeout, f"{os.getpid()}_{k}")
                if run.ok:
                    log(f"{system}: {run.jobs_per_s:,.0f} jobs/s ({run.wall_s:.2f}s), verified; per worker {run.per_worker_jobs}")
                else:
                    rate = f" after {run.jobs_per_s:,.0f} jobs/s ({run.wall_s:.2f}s)" if run.jobs_per_s else ""
                    log(f"{system}: FAILED{rate}: {run.error} effects={run.effects}/{run.distinct_effects} queue={run.queue}")
                runs[system].append(run)
            if fair and not hot_first:
                hot_runs.append(_hot_run(server_dsn, args, k))
        for system in systems:
            summaries[system] = summarize(system, runs[system])
            summaries[system]["options"] = getattr(driver(system), "OPTIONS", {})
        fairness = _fairness(args, runs["nexus"], hot_runs) if fair else None

    print(f"work-queue throughput: {args.items} no-op jobs, {args.workers} worker process(es), "
          f"median of {args.repeat}, Postgres {server_version} (fsync={fsync})")
    for system, s in summaries.items():
        rate = f"{s['jobs_per_s']:>10,.0f} jobs/s  {s['wall_s']:>8.2f} s" if s["verified"] else f"{'FAILED':>10}"
        last = s["runs"][-1]
        detail = last["error"] or f"effects {last['effects']}/{last['distinct_effects']} distinct, queue {last['queue']}"
        wal = f"{s['wal_bytes_per_item']:>7,.0f} B WAL/item" if s["verified"] else ""
        print(f"  {system:<16} {rate}  {wal}  {detail}  options {s['options']}")
    ratios = {}
    for baseline, name in (("raw_skip_locked", "nexus_vs_raw"), ("raw_lanes", "nexus_vs_raw_lanes")):
        rounds = _pair_ratios(runs, "nexus", baseline)
        ratios[name] = round(statistics.median(rounds), 3) if rounds else None
        ratios[f"{name}_rounds"] = rounds
        if rounds:
            print(f"  {name} {ratios[name]:.3f} (median of the rounds' ratios {rounds})")
    if fairness is not None:
        print(f"  fairness: other lanes {fairness['other_lanes_items_per_s_without_hot']} items/s without, "
              f"{fairness['other_lanes_items_per_s_with_hot']} with {args.hot_items} hot-lane items: "
              f"slowdown {fairness['fairness_slowdown']} (median of the rounds' {fairness['fairness_slowdown_rounds']})")

    result = {
        "items": args.items,
        "workers": args.workers,
        "repeat": args.repeat,
        **{f"{system}_jobs_per_s": summaries[system]["jobs_per_s"] if system in summaries else None for system in DRIVERS},
        **{f"{system}_wall_s": summaries[system]["wall_s"] for system in summaries},
        **{f"{system}_wal_bytes_per_item": summaries[system]["wal_bytes_per_item"] for system in summaries},
        **ratios,
        "fairness_slowdown": fairness and fairness["fairness_slowdown"],
        "fairness": fairness,
        "verified": bool(summaries) and all(s["verified"] for s in summaries.values())
                    and (fairness is None or fairness["verified"]),
        "verified_by_system": {system: s["verified"] for system, s in summaries.items()},
        "systems": {
            system: {
                "jobs_per_s_runs": [r["jobs_per_s"] and round(r["jobs_per_s"], 1) for r in s["runs"]],
                "wall_s_runs": [r["wall_s"] and round(r["wall_s"], 3) for r in s["runs"]],
                "wal_bytes_per_item_runs": [r["wal_bytes_per_item"] for r in s["runs"]],
                "checkpoint_in_wal_window": [r["checkpoint_in_window"] for r in s["runs"]],
                "wal_lsn_ranges": [r["wal_lsn_range"] for r in s["runs"]],
                "verification": [
                    {"effects": r["effects"], "distinct_effects": r["distinct_effects"], **r["queue"], "error": r["error"]}
                    for r in s["runs"]
                ],
                "options": s["options"],
            }
            for system, s in summaries.items()
        },
        "cpus": os.cpu_count(),
        "loadavg_1m_start_end": [load_start, round(os.getloadavg()[0], 2)],
        "cpu_steal_pct": steal.pct(),  # the host's share of this machine's CPU time (bench/host.py)
        "commit": commit,
        "postgres": server_version,
        "fsync": fsync,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps(result), flush=True)
    return 0 if result["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
