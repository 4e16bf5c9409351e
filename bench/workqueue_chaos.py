"""Chaos run of the durable work queue: workers are SIGKILLed and restarted while draining,
and the generation is rolled back to the Event path and cut over again in the middle.

    python bench/workqueue_chaos.py --items 20000 --workers 4 --lease 2

Every WorkItem worker process runs bounded `worker.drain` runs (as the sensor launches
them) and one Event-path process runs `event_path.run_event_path` for the generation
throughout (it idles while the generation is WorkItem-owned). Their one handler writes
the item's effect under `claims.lock_fence` (only while the caller still holds the work
on its claim path) keyed by work_id (the first valid write wins; later holders find it
applied and skip). Every few seconds a random process is killed with SIGKILL and a new
one started.

Work arrives in three waves: 60% at the start; 30% once the first wave is finished, when
the run rolls the generation back (kills pause, claims are disabled, the wave arrives and
the fence is retried until it is proven: a refusal names what blocks it, and one that only
WorkItem claims can clear resumes them until that item is finished; a retry is due after
every older pending item, so a rollback in the middle of a backlog waits for it); and 10%
while the Event path owns the generation. Once every fenced
item has its legacy outcome, the run cuts the generation over again (the last wave's
events not yet run become work items) and the WorkItem workers finish. At the end it checks that every
logical work (each work item, and each Event execution without one) has exactly one
applied effect, that no effect was written on both claim paths, that every fenced item
was reconciled from its receipt, and that nothing is left leased or running; the last line
of stdout is one JSON object with the counts.

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
from nexus_pipelines.workqueue import claims, event_path, generations, rollback  # noqa: E402
from nexus_pipelines.workqueue.claims import ClaimedItem  # noqa: E402
from nexus_pipelines.workqueue.handlers import HandlerRegistry  # noqa: E402
from nexus_pipelines.workqueue.receipts import NewWork, enqueue_work_items  # noqa: E402
from nexus_pipelines.workqueue.retry import RetryPolicy  # noqa: E402
from nexus_pipelines.workqueue.worker import drain  # noqa: E402

REG = "chaos"
WORK_TYPE = "chaos.effect"
ROUTES = {"bulk": 1}
POLICY = RetryPolicy(base_s=0.1, cap_s=1.0, jitter=0.5)
DRAIN_BUDGET_S = 2.0  # each worker's drain runs are bounded, as the sensor's are

_SETUP = """
CREATE TABLE chaos_effects (work_id bigint PRIMARY KEY, token bigint NOT NULL, worker text NOT NULL,
                            claim_path text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE chaos_write_outcomes (outcome text NOT NULL, work_id bigint NOT NULL, token bigint NOT NULL,
                                   claim_path text NOT NULL);
CREATE TABLE chaos_control (done boolean NOT NULL);
INSERT INTO chaos_control VALUES (false);
"""

# The keyed effect write, inside the transaction that holds the fence.
_EFFECT = """
INSERT INTO chaos_effects (work_id, token, worker, claim_path) VALUES (%(id)s, %(token)s, %(worker)s, %(path)s)
ON CONFLICT (work_id) DO NOTHING
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
        params = {"id": item.work_id, "token": item.token, "worker": self.worker, "path": item.claim_path}
        with conn.transaction():
            fenced = claims.lock_fence(conn, item)
            applied = fenced and conn.execute(_EFFECT, params).rowcount == 1
            if not applied:
                conn.execute("INSERT INTO chaos_write_outcomes VALUES (%s, %s, %s, %s)",
                             ("duplicate_skipped" if fenced else "stale_rejected", item.work_id, item.token,
                              item.claim_path))
        return "succeeded"


def _unfinished(conn) -> int:
    return conn.execute(
        """SELECT (SELECT count(*) FROM connector_work_items WHERE registration_id = %(r)s
                     AND state NOT IN ('completed', 'dead', 'reconciled_legacy_terminal'))
                + (SELECT count(*) FROM event_executions WHERE registration_id = %(r)s
                     AND state IN ('pending', 'started', 'retry'))""",
        {"r": REG},
    ).fetchone()[0]


def _until_done(dsn: str) -> threading.Event:
    """An event set once the run is over (a row in the database: a shared multiprocessing
    lock could be left held by a process killed while it waited on it)."""
    stop = threading.Event()

    def watch() -> None:
        with connect(dsn) as conn:
            while not stop.wait(0.25):
                if conn.execute("SELECT done FROM chaos_control").fetchone()[0]:
                    stop.set()

    threading.Thread(target=watch, daemon=True).start()
    return stop


def worker_main(dsn: str, worker: str, lease_s: float, concurrency: int, claim_batch: int, work_ms: float) -> None:
    """Bounded drains until the run is over."""
    stop = _until_done(dsn)
    registry = HandlerRegistry({WORK_TYPE: EffectHandler(dsn, worker, work_ms)})
    n = 0
    while not stop.is_set():
        n += 1
        drain(dsn, registry, worker_id=f"{worker}-{n}", registration_ids=[REG], concurrency=concurrency,
              claim_batch=claim_batch, lease_ttl_s=lease_s, retry_policy=POLICY, idle_exit=False,
              poll_interval_s=0.05, stop_event=stop, time_budget_s=DRAIN_BUDGET_S)


def event_path_main(dsn: str, worker: str, lease_s: float, work_ms: float) -> None:
    stop = _until_done(dsn)
    registry = HandlerRegistry({WORK_TYPE: EffectHandler(dsn, worker, work_ms)})
    while not stop.is_set():
        event_path.run_event_path(dsn, registry, REG, 1, worker_id=worker, lease_ttl_s=lease_s,
                                  retry_policy=POLICY, idle_exit=False, poll_interval_s=0.05, stop_event=stop,
                                  time_budget_s=DRAIN_BUDGET_S, project_every_s=1.0)
        stop.wait(0.05)  # lease held by a predecessor, or the generation is not Event-owned: look again


class Processes:
    """The worker processes, killed and restarted at random."""

    def __init__(self, dsn: str, args, rng: random.Random) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.dsn, self.args, self.rng = dsn, args, rng
        self.procs: dict[str, multiprocessing.Process] = {}
        self.kills = {"work_item": 0, "event": 0}

    def start(self, kind: str) -> None:
        name = f"chaos-{kind}-{uuid.uuid4().hex[:6]}"
        a = self.args
        if kind == "event":
            target, args = event_path_main, (self.dsn, name, a.lease, a.work_ms)
        else:
            target, args = worker_main, (self.dsn, name, a.lease, a.concurrency, a.claim_batch, a.work_ms)
        proc = self.ctx.Process(target=target, args=args, daemon=True)
        proc.start()
        self.procs[name] = proc

    def kill_one(self) -> None:
        live = [n for n, p in self.procs.items() if p.is_alive()]
        if not live:
            return
        victim = self.rng.choice(live)
        os.kill(self.procs[victim].pid, signal.SIGKILL)
        self.procs[victim].join(5)
        del self.procs[victim]
        kind = "event" if victim.startswith("chaos-event") else "work_item"
        self.kills[kind] += 1
        self.start(kind)

    def check(self) -> None:
        for name, proc in self.procs.items():
            if not proc.is_alive() and proc.exitcode not in (0, None, -signal.SIGKILL):
                raise RuntimeError(f"worker {name} failed with exit code {proc.exitcode}")

    def stop(self) -> None:
        with connect(self.dsn) as conn:
            conn.execute("UPDATE chaos_control SET done = true")
        for proc in self.procs.values():
            proc.join(30)
            if proc.is_alive():
                proc.kill()


# Refusals that only WorkItem claims can clear: claims resume until the item is finished.
_NEEDS_CLAIMS = ("(expired", "(dispatched", "(ambiguous", "(replayed")
WAVES = (0.6, 0.3, 0.1)  # at the start, at the rollback, while the Event path owns the generation


def _wave(conn, name: str, count: int, lanes: int) -> int:
    work = (
        NewWork(f"chaos-{name}-{i}", WORK_TYPE, max_attempts=10,
                source_lane_key=f"src-{i % lanes}" if lanes else None,
                target_lane_key=f"tgt-{i % 97}" if i % 5 == 0 else None)
        for i in range(count)
    )
    return enqueue_work_items(conn, work, registration_id=REG, revision=1)


class Phases:
    """Rollback and re-cutover in the middle of the run, one step per tick of the main loop."""

    def __init__(self, conn, args) -> None:
        self.conn, self.args = conn, args
        self.phase = "work_items"
        self.fence_id: int | None = None
        self.counts = {"rollback_refusals": 0, "rollbacks_resumed_for_a_blocker": 0, "recutover_refusals": 0,
                       "unknown_outcomes_confirmed": 0, "fenced_items": 0, "enqueued": 0}
        self.times: dict[str, float] = {}
        self._blocker: int | None = None

    @property
    def kills_allowed(self) -> bool:
        # none from the rollback request to the fence: a reclaimed attempt would block it
        return self.phase in ("work_items", "event", "finish")

    def enqueue(self, wave: int) -> None:
        count = round(self.args.items * WAVES[wave])
        self.counts["enqueued"] += _wave(self.conn, str(wave), count, self.args.source_lanes)

    def tick(self) -> None:
        getattr(self, f"_{self.phase}")()

    def _count(self, sql: str, *params) -> int:
        return self.conn.execute(sql, params).fetchone()[0]

    def _work_items(self) -> None:
        left = self._count("SELECT count(*) FROM connector_work_items WHERE registration_id = %s"
                           " AND state NOT IN ('completed', 'dead')", REG)
        if left == 0:
            self.times["rollback_started_s"] = time.monotonic()
            rollback.disable_claims(self.conn, REG, 1, recorded_by="chaos")
            self.enqueue(1)  # pending when the fence comes
            self.phase = "rolling_back"

    def _rolling_back(self) -> None:
        try:
            receipt = rollback.fence(self.conn, REG, 1, recorded_by="chaos")
        except rollback.RollbackRefused as refused:
            self.counts["rollback_refusals"] += 1
            if any(kind in str(refused) for kind in _NEEDS_CLAIMS):
                self._blocker = int(str(refused).split("work item ")[1].split()[0])
                generations.activate(self.conn, REG, 1, recorded_by="chaos", route_versions=ROUTES)
                self.counts["rollbacks_resumed_for_a_blocker"] += 1
                self.phase = "resumed"
            return
        self.fence_id = receipt.receipt_id
        self.counts["fenced_items"] = receipt.proof["fenced_items"]
        self.times["rollback_s"] = time.monotonic() - self.times.pop("rollback_started_s")
        self.enqueue(2)  # new events while the Event path owns the generation
        self.phase = "event"

    def _resumed(self) -> None:
        """Claims run again until the item that blocked the fence is finished."""
        if self._count("SELECT count(*) FROM connector_work_items WHERE work_id = %s"
                       " AND state IN ('pending', 'retry', 'running')", self._blocker) == 0:
            rollback.disable_claims(self.conn, REG, 1, recorded_by="chaos")
            self.phase = "rolling_back"

    def _event(self) -> None:
        self._confirm_unknown_by_evidence()
        left = self._count("SELECT count(*) FROM event_executions WHERE rollback_fence_id = %s"
                           " AND state IN ('pending', 'started', 'retry')", self.fence_id)
        if left == 0:
            generations.quiesce(self.conn, REG, 1, recorded_by="chaos")
            self.times["recutover_started_s"] = time.monotonic()
            self.phase = "recutting"

    def _confirm_unknown_by_evidence(self) -> None:
        """An interrupted attempt that spent the budget has an unknown outcome; the operator here
        can see whether its effect exists, and confirms accordingly."""
        rows = self.conn.execute(
            """SELECT x.work_id, e.work_id IS NOT NULL FROM event_executions x
                 LEFT JOIN chaos_effects e USING (work_id)
                WHERE x.registration_id = %s AND x.state = 'unknown'""", (REG,)).fetchall()
        for work_id, applied in rows:
            event_path.confirm(self.conn, work_id, "succeeded" if applied else "failed", recorded_by="chaos")
            self.counts["unknown_outcomes_confirmed"] += 1

    def _recutting(self) -> None:
        self._confirm_unknown_by_evidence()
        try:
            generations.activate(self.conn, REG, 1, recorded_by="chaos", route_versions=ROUTES)
        except generations.GenerationGateError:
            self.counts["recutover_refusals"] += 1  # a killed executor's lease or started attempt
            return
        self.times["recutover_s"] = time.monotonic() - self.times.pop("recutover_started_s")
        self.phase = "finish"

    def _finish(self) -> None:
        pass


def _verify(conn, phases: Phases) -> dict:
    params = {"r": REG, "fence": phases.fence_id}
    logical, effects, lost, cross_path = conn.execute(
        """WITH logical AS (
               SELECT work_id FROM connector_work_items WHERE registration_id = %(r)s
               UNION SELECT work_id FROM event_executions WHERE registration_id = %(r)s)
           SELECT (SELECT count(*) FROM logical), (SELECT count(*) FROM chaos_effects),
                  (SELECT count(*) FROM logical l WHERE NOT EXISTS
                          (SELECT 1 FROM chaos_effects e WHERE e.work_id = l.work_id)),
                  (SELECT count(*) FROM chaos_write_outcomes o JOIN chaos_effects e USING (work_id)
                    WHERE o.outcome = 'duplicate_skipped' AND o.claim_path <> e.claim_path)""",
        params).fetchone()
    by_path = dict(conn.execute("SELECT claim_path, count(*) FROM chaos_effects GROUP BY claim_path").fetchall())
    outcomes = dict(conn.execute("SELECT outcome, count(*) FROM chaos_write_outcomes GROUP BY outcome").fetchall())
    items_by_state = dict(conn.execute(
        "SELECT state, count(*) FROM connector_work_items WHERE registration_id = %(r)s GROUP BY state", params))
    executions = dict(conn.execute(
        "SELECT state, count(*) FROM event_executions WHERE registration_id = %(r)s GROUP BY state", params))
    reconciled = conn.execute(
        """SELECT count(*) FROM connector_work_items w
             JOIN LATERAL (SELECT digest FROM legacy_outcome_receipts l WHERE l.work_id = w.work_id
                            ORDER BY version DESC LIMIT 1) r ON r.digest = w.legacy_outcome_digest
            WHERE w.rollback_fence_id = %(fence)s AND w.state = 'reconciled_legacy_terminal'""", params).fetchone()[0]
    reclaims, multi_attempt, leased_past, running = conn.execute(
        """SELECT coalesce(sum(reclaims), 0), count(*) FILTER (WHERE attempts > 1),
                  (SELECT count(*) FROM connector_work_items WHERE state = 'running' AND lease_until <= now()),
                  (SELECT count(*) FROM connector_work_items WHERE state = 'running')
             FROM connector_work_items WHERE registration_id = %(r)s""", params).fetchone()
    return {
        "logical_work": logical, "expected_logical_work": phases.counts["enqueued"],
        "effects_applied": effects, "effects_by_claim_path": by_path, "lost": lost,
        "applied_on_both_claim_paths": cross_path, "duplicate_effect_writes_skipped": outcomes.get(
            "duplicate_skipped", 0), "stale_effect_writes_rejected": outcomes.get("stale_rejected", 0),
        "work_items_by_state": items_by_state, "event_executions_by_state": executions,
        "fenced_reconciled_from_receipt": reconciled, "reclaims": int(reclaims),
        "items_with_more_than_one_attempt": multi_attempt, "left_leased_past_lease": leased_past,
        "left_running": running,
    }


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


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--lease", type=float, default=2.0, help="lease seconds (items and the scheduler lease)")
    parser.add_argument("--kill-every", type=float, default=2.0, help="mean seconds between kills")
    parser.add_argument("--concurrency", type=int, default=4, help="handlers per worker")
    parser.add_argument("--claim-batch", type=int, default=50)
    parser.add_argument("--work-ms", type=float, default=4.0, help="max simulated handler work per item")
    parser.add_argument("--source-lanes", type=int, default=2000, help="0 for no source lanes")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--admin-dsn", default=None)
    return parser.parse_args()


def _run(dsn: str, args, rng: random.Random, procs: Processes) -> tuple[Phases, float, float]:
    with connect(dsn) as conn:
        conn.execute(_SETUP)
        phases = Phases(conn, args)
        phases.enqueue(0)
        generations.activate(conn, REG, 1, recorded_by="chaos", route_versions=ROUTES)
        for _ in range(args.workers):
            procs.start("work_item")
        procs.start("event")
        started = time.monotonic()
        next_kill = started + rng.uniform(0.5, 1.5) * args.kill_every
        max_expired_age = 0.0
        while time.monotonic() - started < args.timeout:
            time.sleep(0.25)
            (expired_age,) = conn.execute(
                """SELECT coalesce(extract(epoch FROM max(now() - lease_until)), 0) FROM connector_work_items
                    WHERE state = 'running' AND lease_until IS NOT NULL""").fetchone()
            max_expired_age = max(max_expired_age, float(expired_age))
            phases.tick()
            if phases.phase == "finish" and _unfinished(conn) == 0:
                break
            if phases.kills_allowed and time.monotonic() >= next_kill:
                procs.kill_one()
                next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * args.kill_every
            procs.check()
        return phases, time.monotonic() - started, max_expired_age


def main() -> int:
    args = _arguments()
    rng = random.Random(args.seed)
    from nexus_pipelines.local.postgres import drop_database, ensure_database, with_database

    cleanup: list = []
    admin = _admin_dsn(args, cleanup)
    dbname = f"wq_chaos_{uuid.uuid4().hex[:8]}"
    ensure_database(admin, dbname)
    dsn = with_database(admin, dbname)
    procs = Processes(dsn, args, rng)
    try:
        apply_migrations(dsn)
        phases, elapsed, max_expired_age = _run(dsn, args, rng, procs)
        procs.stop()
        with connect(dsn) as conn:
            checks = _verify(conn, phases)
        result = {
            "items": args.items, "workers": args.workers, "lease_s": args.lease, "kills": procs.kills,
            "elapsed_s": round(elapsed, 2), "phase_at_end": phases.phase, **phases.counts,
            **{k: round(v, 2) for k, v in phases.times.items()}, **checks,
            "max_expired_lease_age_seen_s": round(max_expired_age, 3),
        }
        result["ok"] = bool(
            phases.phase == "finish"
            and checks["lost"] == 0
            and checks["applied_on_both_claim_paths"] == 0
            and checks["logical_work"] == checks["expected_logical_work"] == checks["effects_applied"]
            and checks["fenced_reconciled_from_receipt"] == phases.counts["fenced_items"] > 0
            and checks["left_leased_past_lease"] == 0
            and checks["left_running"] == 0
        )
        print(json.dumps(result, sort_keys=True))
        return 0 if result["ok"] else 1
    finally:
        for proc in procs.procs.values():
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
