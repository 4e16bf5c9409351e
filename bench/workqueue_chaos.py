"""Chaos run of the durable work queue: workers are SIGKILLed and restarted while draining.

    python bench/workqueue_chaos.py --items 20000 --workers 4 --lease 2

Every worker process runs `workqueue.worker.drain` with a handler that writes the
item's effect fenced by its token (only while the token still holds the item and its
lease is unexpired) and keyed by work_id (the first valid write wins; later holders
find it applied and skip). Every few seconds a random worker is killed with SIGKILL
and a new one started. At the end the run checks that every item completed, that
each item's effect was applied exactly once, and that no item is left leased past
its lease; the last line of stdout is one JSON object with the counts.

Postgres: the server named by --admin-dsn or NEXUS_PG_DSN (a role that may create
databases), else an embedded server in a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nexus_pipelines.control.db import connect  # noqa: E402
from nexus_pipelines.control.migrations import apply_migrations  # noqa: E402
from nexus_pipelines.workqueue.claims import ClaimedItem  # noqa: E402
from nexus_pipelines.workqueue.generations import activate  # noqa: E402
from nexus_pipelines.workqueue.handlers import HandlerRegistry  # noqa: E402
from nexus_pipelines.workqueue.receipts import NewWork, enqueue_work_items  # noqa: E402
from nexus_pipelines.workqueue.retry import RetryPolicy  # noqa: E402
from nexus_pipelines.workqueue.worker import drain  # noqa: E402

REG = "chaos"
WORK_TYPE = "chaos.effect"

_SETUP = """
CREATE TABLE chaos_effects (work_id bigint PRIMARY KEY, token bigint NOT NULL, worker text NOT NULL,
                            applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE chaos_write_outcomes (outcome text NOT NULL, work_id bigint NOT NULL, token bigint NOT NULL);
"""

# One statement: the fence (token still holds the running item, lease unexpired) and the
# keyed effect write; it reports which of applied / duplicate / rejected happened.
_EFFECT = """
WITH fence AS (
    SELECT 1 FROM connector_work_items
     WHERE work_id = %(id)s AND lease_token = %(token)s AND state = 'running' AND lease_until > now()
),
applied AS (
    INSERT INTO chaos_effects (work_id, token, worker)
    SELECT %(id)s, %(token)s, %(worker)s FROM fence
    ON CONFLICT (work_id) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM fence), (SELECT count(*) FROM applied)
"""


class EffectHandler:
    def __init__(self, dsn: str, worker: str, work_ms: float) -> None:
        self.dsn = dsn
        self.worker = worker
        self.work_ms = work_ms
        self.local = threading.local()

    def __call__(self, item: ClaimedItem) -> str:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = connect(self.dsn)
        if self.work_ms:
            time.sleep(random.random() * self.work_ms / 1000)
        fenced, applied = conn.execute(
            _EFFECT, {"id": item.work_id, "token": item.token, "worker": self.worker}
        ).fetchone()
        if not applied:
            outcome = "duplicate_skipped" if fenced else "stale_rejected"
            conn.execute("INSERT INTO chaos_write_outcomes VALUES (%s, %s, %s)", (outcome, item.work_id, item.token))
        return "succeeded"


def _unfinished(conn) -> int:
    return conn.execute(
        "SELECT count(*) FROM connector_work_items WHERE registration_id = %s AND state NOT IN ('completed', 'dead')",
        (REG,),
    ).fetchone()[0]


def worker_main(dsn: str, worker: str, lease_s: float, concurrency: int, claim_batch: int, work_ms: float) -> None:
    stop = threading.Event()

    def watch() -> None:
        with connect(dsn) as conn:
            while not stop.wait(0.5):
                if _unfinished(conn) == 0:
                    stop.set()

    threading.Thread(target=watch, daemon=True).start()
    registry = HandlerRegistry({WORK_TYPE: EffectHandler(dsn, worker, work_ms)})
    drain(
        dsn,
        registry,
        worker_id=worker,
        registration_ids=[REG],
        concurrency=concurrency,
        claim_batch=claim_batch,
        lease_ttl_s=lease_s,
        retry_policy=RetryPolicy(base_s=0.1, cap_s=1.0, jitter=0.5),
        idle_exit=False,
        poll_interval_s=0.05,
        stop_event=stop,
    )


def _admin_dsn(args, stack: list) -> str:
    dsn = args.admin_dsn or os.environ.get("NEXUS_PG_DSN")
    if dsn:
        return dsn
    from nexus_pipelines.local.postgres import FAST_SETTINGS, EmbeddedPostgres

    root = Path(tempfile.mkdtemp(prefix="wq-chaos-"))
    os.chmod(root, 0o755)
    server = EmbeddedPostgres(root, settings=FAST_SETTINGS)
    info = server.start()
    stack.append(lambda: (server.stop(), shutil.rmtree(root, ignore_errors=True)))
    return info.dsn()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--lease", type=float, default=2.0, help="lease seconds")
    parser.add_argument("--kill-every", type=float, default=2.0, help="mean seconds between kills")
    parser.add_argument("--concurrency", type=int, default=4, help="handlers per worker")
    parser.add_argument("--claim-batch", type=int, default=50)
    parser.add_argument("--work-ms", type=float, default=4.0, help="max simulated handler work per item")
    parser.add_argument("--source-lanes", type=int, default=2000, help="0 for no source lanes")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--admin-dsn", default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    from nexus_pipelines.local.postgres import drop_database, ensure_database, with_database

    cleanup: list = []
    admin = _admin_dsn(args, cleanup)
    dbname = f"wq_chaos_{uuid.uuid4().hex[:8]}"
    ensure_database(admin, dbname)
    dsn = with_database(admin, dbname)
    ctx = multiprocessing.get_context("spawn")
    procs: dict[str, multiprocessing.Process] = {}
    kills = 0
    try:
        apply_migrations(dsn)
        with connect(dsn) as conn:
            conn.execute(_SETUP)
            lanes = args.source_lanes
            enqueue_work_items(
                conn,
                (
                    NewWork(
                        f"chaos-{i}", WORK_TYPE, max_attempts=10,
                        source_lane_key=f"src-{i % lanes}" if lanes else None,
                        target_lane_key=f"tgt-{i % 97}" if i % 5 == 0 else None,
                    )
                    for i in range(args.items)
                ),
                registration_id=REG,
                revision=1,
            )
            activate(conn, REG, 1, recorded_by="chaos", route_versions={"bulk": 1})

        def start_worker() -> None:
            name = f"chaos-worker-{uuid.uuid4().hex[:6]}"
            proc = ctx.Process(
                target=worker_main,
                args=(dsn, name, args.lease, args.concurrency, args.claim_batch, args.work_ms),
                daemon=True,
            )
            proc.start()
            procs[name] = proc

        for _ in range(args.workers):
            start_worker()
        started = time.monotonic()
        next_kill = started + rng.uniform(0.5, 1.5) * args.kill_every
        max_expired_age = 0.0
        max_running = 0
        with connect(dsn) as conn:
            while time.monotonic() - started < args.timeout:
                time.sleep(0.25)
                left = _unfinished(conn)
                expired_age, running = conn.execute(
                    """SELECT coalesce(extract(epoch FROM max(now() - lease_until)), 0), count(*)
                         FROM connector_work_items WHERE state = 'running'
                          AND lease_until IS NOT NULL"""
                ).fetchone()
                max_expired_age = max(max_expired_age, float(expired_age))
                max_running = max(max_running, running)
                if left == 0:
                    break
                if time.monotonic() >= next_kill:
                    live = [n for n, p in procs.items() if p.is_alive()]
                    if live:
                        victim = rng.choice(live)
                        os.kill(procs[victim].pid, signal.SIGKILL)
                        procs[victim].join(5)
                        del procs[victim]
                        kills += 1
                        start_worker()
                    next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * args.kill_every
                for name, proc in list(procs.items()):
                    if not proc.is_alive() and proc.exitcode not in (0, None) and proc.exitcode != -signal.SIGKILL:
                        raise RuntimeError(f"worker {name} failed with exit code {proc.exitcode}")
            elapsed = time.monotonic() - started
        for proc in procs.values():
            proc.join(30)

        with connect(dsn) as conn:
            states = dict(
                conn.execute(
                    "SELECT state, count(*) FROM connector_work_items WHERE registration_id = %s GROUP BY state", (REG,)
                ).fetchall()
            )
            effects, missing_effect = conn.execute(
                """SELECT (SELECT count(*) FROM chaos_effects),
                          (SELECT count(*) FROM connector_work_items w
                            WHERE w.registration_id = %s AND NOT EXISTS
                                  (SELECT 1 FROM chaos_effects e WHERE e.work_id = w.work_id))""",
                (REG,),
            ).fetchone()
            # chaos_effects.work_id is the primary key, so an item cannot carry two applied effects;
            # count them anyway from the write log, and the effects written by an earlier holder.
            (effects_twice,) = conn.execute(
                "SELECT count(*) FROM (SELECT work_id FROM chaos_effects GROUP BY work_id HAVING count(*) > 1) d"
            ).fetchone()
            (by_killed_holder,) = conn.execute(
                """SELECT count(*) FROM chaos_effects e JOIN connector_work_items w USING (work_id)
                    WHERE e.token <> w.lease_token"""
            ).fetchone()
            outcomes = dict(conn.execute("SELECT outcome, count(*) FROM chaos_write_outcomes GROUP BY outcome").fetchall())
            reclaims, max_attempts, multi_attempt = conn.execute(
                """SELECT coalesce(sum(reclaims), 0), coalesce(max(attempts), 0), count(*) FILTER (WHERE attempts > 1)
                     FROM connector_work_items WHERE registration_id = %s""",
                (REG,),
            ).fetchone()
            leased_past_lease, still_running = conn.execute(
                """SELECT count(*) FILTER (WHERE lease_until <= now()), count(*)
                     FROM connector_work_items WHERE state = 'running'"""
            ).fetchone()
        completed = states.get("completed", 0)
        result = {
            "items": args.items,
            "workers": args.workers,
            "lease_s": args.lease,
            "kills": kills,
            "elapsed_s": round(elapsed, 2),
            "items_per_s": round(completed / elapsed, 1) if elapsed else 0,
            "completed": completed,
            "dead": states.get("dead", 0),
            "not_finished": args.items - completed - states.get("dead", 0),
            "effects_applied": effects,
            "items_without_effect": missing_effect,
            "effects_applied_more_than_once": effects_twice,
            "effects_applied_by_a_holder_that_was_later_killed": by_killed_holder,
            "duplicate_effect_writes_skipped": outcomes.get("duplicate_skipped", 0),
            "stale_effect_writes_rejected": outcomes.get("stale_rejected", 0),
            "reclaims": int(reclaims),
            "items_with_more_than_one_attempt": multi_attempt,
            "max_attempts_seen": max_attempts,
            "max_running_seen": max_running,
            "max_expired_lease_age_seen_s": round(max_expired_age, 3),
            "left_leased_past_lease": leased_past_lease,
            "left_running": still_running,
        }
        result["ok"] = bool(
            completed == args.items
            and effects == args.items
            and effects_twice == 0
            and missing_effect == 0
            and leased_past_lease == 0
            and still_running == 0
        )
        print(json.dumps(result, sort_keys=True))
        return 0 if result["ok"] else 1
    finally:
        for proc in procs.values():
            if proc.is_alive():
                proc.kill()
        try:
            drop_database(admin, dbname)
        except Exception:  # noqa: BLE001 - best effort
            pass
        for fn in cleanup:
            fn()


if __name__ == "__main__":
    sys.exit(main())
