"""Many workers (threads and processes) racing for the same items; SIGKILL mid-item."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import threading
import time
from datetime import timedelta

import pytest

from nexus_pipelines.control.db import connect
from nexus_pipelines.workqueue import claims
from nexus_pipelines.workqueue.claims import ClaimedItem
from nexus_pipelines.workqueue.generations import quiesce
from nexus_pipelines.workqueue.handlers import HandlerRegistry
from nexus_pipelines.workqueue.receipts import NewWork
from nexus_pipelines.workqueue.retry import RetryPolicy
from nexus_pipelines.workqueue.worker import drain

from .conftest import enqueue

pytestmark = pytest.mark.slow

FAST_RETRY = RetryPolicy(base_s=0.05, cap_s=0.2, jitter=0.5)

_SETUP = """
CREATE TABLE IF NOT EXISTS test_exec_log (
    work_id bigint NOT NULL, token bigint NOT NULL, worker text NOT NULL,
    source_lane text, target_lane text, started_at timestamptz NOT NULL, finished_at timestamptz);
CREATE TABLE IF NOT EXISTS test_start (reg text NOT NULL, worker text NOT NULL);
CREATE TABLE IF NOT EXISTS test_first_item (reg text NOT NULL, worker text NOT NULL, PRIMARY KEY (reg, worker));
CREATE TABLE IF NOT EXISTS test_effects (
    work_id bigint PRIMARY KEY, token bigint NOT NULL, writes integer NOT NULL DEFAULT 1);
"""

# The handler's effect is written fenced by its token: only while the token still holds
# the item, and keyed by work_id (a later holder's write replaces an earlier one's).
_EFFECT = """
INSERT INTO test_effects AS e (work_id, token)
SELECT %(id)s, %(token)s
 WHERE EXISTS (SELECT 1 FROM connector_work_items
                WHERE work_id = %(id)s AND lease_token = %(token)s AND state = 'running' AND lease_until > now())
ON CONFLICT (work_id) DO UPDATE SET token = EXCLUDED.token, writes = e.writes + 1 WHERE e.token < EXCLUDED.token
"""


class _Recorder:
    """A handler writing an execution log row and a fenced effect, on a per-thread connection.

    With ``racers`` above one, no item finishes until that many workers have each started
    one: a fast worker cannot drain everything before a slower one's first claim, so the
    race is certain rather than likely (on a busy machine a thread can lose every claim).
    """

    def __init__(self, dsn: str, reg: str, worker: str, racers: int = 1, sleep_ms: float = 2.0) -> None:
        self.dsn = dsn
        self.reg = reg
        self.worker = worker
        self.racers = racers
        self.sleep_ms = sleep_ms
        self.local = threading.local()
        self.all_racing = threading.Event()

    def conn(self):
        if getattr(self.local, "conn", None) is None:
            self.local.conn = connect(self.dsn)
        return self.local.conn

    def _wait_for_every_racer(self, conn) -> None:
        conn.execute("INSERT INTO test_first_item VALUES (%s, %s) ON CONFLICT DO NOTHING", (self.reg, self.worker))
        deadline = time.monotonic() + 20  # well inside the 30 s lease
        while not self.all_racing.is_set() and time.monotonic() < deadline:
            (started,) = conn.execute("SELECT count(*) FROM test_first_item WHERE reg = %s", (self.reg,)).fetchone()
            if started >= self.racers:
                self.all_racing.set()
            else:
                time.sleep(0.01)

    def __call__(self, item: ClaimedItem) -> str:
        conn = self.conn()
        (started,) = conn.execute("SELECT clock_timestamp()").fetchone()
        if self.racers > 1 and not self.all_racing.is_set():
            self._wait_for_every_racer(conn)
        time.sleep(random.random() * self.sleep_ms / 1000)
        conn.execute(_EFFECT, {"id": item.work_id, "token": item.token})
        conn.execute(
            "INSERT INTO test_exec_log VALUES (%s, %s, %s, %s, %s, %s, clock_timestamp())",
            (item.work_id, item.token, self.worker, item.source_lane_key, item.target_lane_key, started),
        )
        return "succeeded"


def _unfinished(dsn: str, reg: str) -> int:
    with connect(dsn) as conn:
        return conn.execute(
            "SELECT count(*) FROM connector_work_items WHERE registration_id = %s AND state NOT IN ('completed', 'dead')",
            (reg,),
        ).fetchone()[0]


def _drain_until_done(
    dsn: str, reg: str, worker: str, concurrency: int, claim_batch: int, deadline_s: float, racers: int = 1
) -> dict:
    registry = HandlerRegistry({"rec": _Recorder(dsn, reg, worker, racers)})
    totals = {"claimed": 0, "completed": 0, "lost": 0}
    if racers > 1:
        # every racer registers, then waits for the start signal ('go' row), so all start together
        with connect(dsn) as conn:
            conn.execute("INSERT INTO test_start VALUES (%s, %s)", (reg, worker))
            for _ in range(600):
                if conn.execute("SELECT 1 FROM test_start WHERE reg = %s AND worker = 'go'", (reg,)).fetchone():
                    break
                time.sleep(0.01)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        report = drain(
            dsn, registry, worker_id=worker, registration_ids=[reg], concurrency=concurrency, claim_batch=claim_batch,
            lease_ttl_s=30, time_budget_s=max(end - time.monotonic(), 0.1), retry_policy=FAST_RETRY,
        )
        for key in totals:
            totals[key] += getattr(report, key)
        if _unfinished(dsn, reg) == 0:
            break
        time.sleep(0.02)
    return totals


def test_threads_and_processes_race_for_the_same_items(control_dsn, reg):
    with connect(control_dsn) as conn:
        conn.execute(_SETUP)
        work = []
        for i in range(400):
            if i % 4 == 0:
                work.append(NewWork(f"{reg}-{i}", "rec"))  # no lanes
            elif i % 4 == 1:
                work.append(NewWork(f"{reg}-{i}", "rec", target_lane_key=f"tgt-{i % 6}"))
            else:
                work.append(NewWork(f"{reg}-{i}", "rec", source_lane_key=f"src-{i % 10}", target_lane_key=f"tgt-{i % 7}"))
        enqueue(conn, reg, work)

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        async_results = [
            pool.apply_async(_drain_until_done, (control_dsn, reg, f"proc-{n}", 4, 10, 90, 4)) for n in range(2)
        ]
        thread_results: list[dict] = []
        threads = [
            threading.Thread(
                target=lambda n=n: thread_results.append(
                    _drain_until_done(control_dsn, reg, f"thread-{n}", 2, 5, 90, 4)
                )
            )
            for n in range(2)
        ]
        for t in threads:
            t.start()
        with connect(control_dsn) as conn:
            for _ in range(1200):
                if conn.execute("SELECT count(*) FROM test_start WHERE reg = %s", (reg,)).fetchone()[0] >= 4:
                    break
                time.sleep(0.05)
            conn.execute("INSERT INTO test_start VALUES (%s, 'go')", (reg,))
        for t in threads:
            t.join(120)
        proc_results = [r.get(120) for r in async_results]

    results = proc_results + thread_results
    assert sum(r["completed"] for r in results) == 400
    assert sum(r["lost"] for r in results) == 0
    with connect(control_dsn) as conn:
        states = dict(conn.execute(
            "SELECT state, count(*) FROM connector_work_items WHERE registration_id = %s GROUP BY state", (reg,)
        ).fetchall())
        assert states == {"completed": 400}
        # each item ran once, by the holder whose token completed it, and its effect carries that token
        (bad,) = conn.execute(
            """SELECT count(*) FROM connector_work_items w
                 LEFT JOIN test_effects e USING (work_id)
                WHERE w.registration_id = %s
                  AND (e.token IS DISTINCT FROM w.lease_token OR e.writes <> 1
                       OR (SELECT count(*) FROM test_exec_log l WHERE l.work_id = w.work_id) <> 1)""",
            (reg,),
        ).fetchone()
        assert bad == 0
        log = conn.execute(
            """SELECT l.work_id, l.source_lane, l.target_lane, l.started_at, l.finished_at, l.worker FROM test_exec_log l
                 JOIN connector_work_items w USING (work_id) WHERE w.registration_id = %s ORDER BY l.started_at""",
            (reg,),
        ).fetchall()
    assert len(log) == 400
    by_source: dict[str, list] = {}
    by_target: dict[str, list] = {}
    assert len({row[5] for row in log}) == 4, "the workers did not race"
    for work_id, src, tgt, started, finished, _worker in log:
        if src:
            by_source.setdefault(src, []).append((work_id, started, finished))
        if tgt:
            by_target.setdefault(tgt, []).append((work_id, started, finished))
    for lane, runs in by_source.items():
        assert [w for w, _, _ in runs] == sorted(w for w, _, _ in runs), f"source lane {lane} ran out of order"
        assert all(a[2] <= b[1] for a, b in zip(runs, runs[1:])), f"source lane {lane} overlapped"
    for lane, runs in by_target.items():
        assert all(a[2] <= b[1] for a, b in zip(runs, runs[1:])), f"target lane {lane} overlapped"


def _slow_handler_process(dsn: str, reg: str) -> None:
    def slow(item: ClaimedItem) -> None:
        with connect(dsn) as conn:
            conn.execute(
                "INSERT INTO test_exec_log VALUES (%s, %s, 'victim', NULL, NULL, clock_timestamp(), NULL)",
                (item.work_id, item.token),
            )
        time.sleep(60)

    drain(dsn, HandlerRegistry({"rec": slow}), worker_id="victim", registration_ids=[reg], lease_ttl_s=1.0,
          concurrency=1, claim_batch=1, time_budget_s=60)


def test_sigkilled_worker_item_is_reclaimed_after_its_lease_and_completes_once(control_dsn, reg):
    with connect(control_dsn) as conn:
        conn.execute(_SETUP)
        enqueue(conn, reg, [NewWork(f"{reg}-victim", "rec")])
        (work_id,) = conn.execute("SELECT work_id FROM connector_work_items WHERE registration_id = %s", (reg,)).fetchone()
    proc = multiprocessing.get_context("spawn").Process(target=_slow_handler_process, args=(control_dsn, reg))
    proc.start()
    try:
        with connect(control_dsn) as conn:
            for _ in range(300):
                if conn.execute("SELECT 1 FROM test_exec_log WHERE work_id = %s", (work_id,)).fetchone():
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the victim never started the item")
            # the heartbeat keeps renewing while the victim lives
            time.sleep(1.2)
            assert conn.execute("SELECT state, lease_until > now() FROM connector_work_items WHERE work_id = %s",
                                (work_id,)).fetchone() == ("running", True)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
    finally:
        if proc.is_alive():
            proc.kill()
    result = _drain_until_done(control_dsn, reg, "rescuer", 1, 10, 30)
    assert result["completed"] == 1
    with connect(control_dsn) as conn:
        state, attempts, reclaims, token = conn.execute(
            "SELECT state, attempts, reclaims, lease_token FROM connector_work_items WHERE work_id = %s", (work_id,)
        ).fetchone()
        effect = conn.execute("SELECT token, writes FROM test_effects WHERE work_id = %s", (work_id,)).fetchone()
        runs = conn.execute("SELECT worker, token FROM test_exec_log WHERE work_id = %s ORDER BY token", (work_id,)).fetchall()
    assert (state, attempts, reclaims) == ("completed", 2, 1)
    assert effect == (token, 1)
    assert [w for w, _ in runs] == ["victim", "rescuer"] and runs[1][1] == token > runs[0][1]


def test_quiesce_racing_claimers_admits_no_claim_after_it_returns(control_dsn, reg):
    with connect(control_dsn) as conn:
        enqueue(conn, reg, [NewWork(f"{reg}-{i}", "t") for i in range(3000)])
    stop = threading.Event()

    def claimer() -> None:
        with connect(control_dsn) as conn:
            while not stop.is_set():
                got = claims.claim_batch(conn, owner="c", limit=1, lease_ttl=timedelta(seconds=30), registration_ids=[reg])
                claims.complete(conn, [i.fence for i in got])
                time.sleep(0.002)

    threads = [threading.Thread(target=claimer) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        with connect(control_dsn) as conn:
            count = lambda: conn.execute(  # noqa: E731
                "SELECT count(*) FROM connector_work_items WHERE registration_id = %s AND attempts > 0", (reg,)
            ).fetchone()[0]
            for _ in range(500):  # quiesce while the claimers are busy
                if count() > 0:
                    break
                time.sleep(0.02)
            quiesce(conn, reg, 1, recorded_by="test")
            after_quiesce = count()
            time.sleep(0.3)
            assert count() == after_quiesce
            assert 0 < after_quiesce < 3000
    finally:
        stop.set()
        for t in threads:
            t.join(10)


def _router_that_hangs(dsn: str, reg: str) -> None:
    from nexus_pipelines.workqueue.receipts import Route, route_receipts

    def hang(receipt):
        with connect(dsn) as conn:
            conn.execute("INSERT INTO test_start VALUES (%s, 'router-started')", (reg,))
        time.sleep(60)
        return []

    with connect(dsn) as conn:
        route_receipts(conn, {"k": Route("k", 1, hang)}, owner="doomed", limit=10, lease_ttl=timedelta(seconds=1))


def test_receipt_survives_a_killed_router_and_materializes_once(control_dsn, reg):
    from datetime import datetime, timezone

    from nexus_pipelines.workqueue.receipts import EventSpec, ReceiptIn, Route, WorkSpec, admit_receipt, route_receipts

    with connect(control_dsn) as conn:
        conn.execute(_SETUP)
        rid = admit_receipt(
            conn,
            ReceiptIn(registration_id=reg, revision=1, namespace="n", delivery_id="d1", route_key="k",
                      received_at=datetime.now(timezone.utc), body={"id": "X"}),
        ).receipt_id
    proc = multiprocessing.get_context("spawn").Process(target=_router_that_hangs, args=(control_dsn, reg))
    proc.start()
    try:
        with connect(control_dsn) as conn:
            for _ in range(300):
                if conn.execute("SELECT 1 FROM test_start WHERE reg = %s AND worker = 'router-started'", (reg,)).fetchone():
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the router never started")
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
    finally:
        if proc.is_alive():
            proc.kill()
    routes = {"k": Route("k", 1, lambda r: [EventSpec("obj", "X", f"{reg}:X", [WorkSpec("w")])])}
    with connect(control_dsn) as conn:  # "after the restart"
        for _ in range(100):
            if route_receipts(conn, routes, owner="restarted", limit=10).materialized:
                break
            time.sleep(0.05)
        status, attempts, events = conn.execute(
            "SELECT routing_status, routing_attempts, cardinality(enqueued_event_ids) FROM ingress_receipts"
            " WHERE receipt_id = %s",
            (rid,),
        ).fetchone()
        (items,) = conn.execute("SELECT count(*) FROM connector_work_items WHERE registration_id = %s", (reg,)).fetchone()
    assert (status, attempts, events, items) == ("materialized", 2, 1, 1)


def _until(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the race did not reach its next phase"
        time.sleep(0.05)


def _retry_gate(gate, timeout_s: float = 60.0):
    """Run a gate until it goes through (it refuses while executors still hold what it waits for)."""
    from nexus_pipelines.workqueue.generations import GenerationGateError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return gate()
        except GenerationGateError:
            assert time.monotonic() < deadline, "a gate never went through"
            time.sleep(0.1)


def test_work_item_drains_and_an_event_executor_on_one_generation_never_run_the_same_work(control_dsn, reg):
    from nexus_pipelines.workqueue import event_path, generations, rollback
    from nexus_pipelines.workqueue.receipts import enqueue_work_items

    from .support import FencedEffects, effects

    with connect(control_dsn) as conn:
        enqueue(conn, reg, [NewWork(f"{reg}-{i}", "rec", source_lane_key=f"s{i % 7}") for i in range(240)])
    handler = FencedEffects(control_dsn)
    registry = HandlerRegistry({"rec": handler})
    stop = threading.Event()

    def work_item_drain(n: int) -> None:
        while not stop.is_set():  # bounded drains, as the sensor launches them
            drain(control_dsn, registry, worker_id=f"drain-{n}-{time.monotonic()}", registration_ids=[reg],
                  concurrency=2, claim_batch=5, time_budget_s=0.4, idle_exit=False, poll_interval_s=0.02,
                  stop_event=stop)

    def event_executor() -> None:
        while not stop.is_set():
            event_path.run_event_path(control_dsn, registry, reg, 1, time_budget_s=0.4, idle_exit=False,
                                      poll_interval_s=0.02, lease_ttl_s=5, stop_event=stop)
            stop.wait(0.02)

    threads = [threading.Thread(target=work_item_drain, args=(n,)) for n in range(2)]
    threads.append(threading.Thread(target=event_executor))
    for t in threads:
        t.start()
    try:
        with connect(control_dsn) as conn:
            done = lambda: len(handler.calls)  # noqa: E731
            _until(lambda: done() >= 40)
            rollback.disable_claims(conn, reg, 1, recorded_by="race")
            fence = _retry_gate(lambda: rollback.fence(conn, reg, 1, recorded_by="race"))
            assert fence.proof["fenced_items"] > 0
            # new work while the Event path owns the generation, then a cutover while some of it is unfinished
            enqueue_work_items(conn, [NewWork(f"{reg}-late-{i}", "rec") for i in range(60)],
                               registration_id=reg, revision=1)
            fenced_left = lambda: conn.execute(  # noqa: E731
                "SELECT count(*) FROM event_executions WHERE rollback_fence_id = %s"
                " AND state NOT IN ('succeeded', 'failed')", (fence.receipt_id,)).fetchone()[0]
            _until(lambda: fenced_left() == 0)
            generations.quiesce(conn, reg, 1, recorded_by="race")
            cutover = _retry_gate(lambda: generations.activate(conn, reg, 1, recorded_by="race",
                                                               route_versions={"bulk": 1}))
            unfinished = lambda: conn.execute(  # noqa: E731
                "SELECT count(*) FROM connector_work_items WHERE registration_id = %s"
                " AND state IN ('pending', 'retry', 'running', 'awaiting_legacy_outcome')", (reg,)).fetchone()[0]
            _until(lambda: unfinished() == 0)
    finally:
        stop.set()
        for t in threads:
            t.join(30)

    with connect(control_dsn) as conn:
        all_work = [r[0] for r in conn.execute(
            """SELECT work_id FROM connector_work_items WHERE registration_id = %(r)s
               UNION SELECT work_id FROM event_executions WHERE registration_id = %(r)s""", {"r": reg})]
        applied = effects(conn, all_work)
        late = dict(conn.execute(
            "SELECT work_id, state FROM event_executions WHERE registration_id = %s AND rollback_fence_id IS NULL",
            (reg,)).fetchall())
    assert len(all_work) == 300 and len(late) == 60
    calls_per_work: dict[int, list[str]] = {}
    for work_id, path in handler.calls:
        calls_per_work.setdefault(work_id, []).append(path)
    assert all(len(paths) == 1 for paths in calls_per_work.values()), "some work ran twice"
    assert sorted(calls_per_work) == sorted(all_work)
    assert {w: writes for w, (_, writes) in applied.items()} == {w: 1 for w in all_work}
    assert {path for path, _ in applied.values()} == {"work_item", "event"}
    # late work ran on the Event path, or was handed to work items at the cutover (same id), never both
    transferred = {w for w, state in late.items() if state == "transferred"}
    assert len(transferred) == cutover.proof["cutover"]["materialized_work_items"]
    assert {w: applied[w][0] for w in late} == {w: "work_item" if w in transferred else "event" for w in late}
