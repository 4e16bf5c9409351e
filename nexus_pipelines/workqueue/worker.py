"""The drain loop: claim in batches, run handlers, renew leases, finalize in batches.

One drain is one queue scanner (one claim statement at a time on its own
connection). `concurrency` only sets how many claimed items run at once on a
bounded thread pool; it never adds scanners. While handlers run, a heartbeat thread
renews all held leases in one statement on a second connection, and marks items
whose renewal failed as lost (their `lease_lost` event is set and their results are
discarded). Results are finalized in batches: one fenced statement completes every
finished item, one records every failure.

The drain stops when `max_items` items were claimed, the `time_budget_s` is spent
(then it stops claiming and lets running items finish), the queue is idle (with
`idle_exit`), or `stop_event` is set.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Iterator

from psycopg import Connection
from psycopg_pool import ConnectionPool

from nexus_pipelines.control.db import connect
from nexus_pipelines.workqueue import claims
from nexus_pipelines.workqueue.claims import ClaimedItem, Failure
from nexus_pipelines.workqueue.handlers import HandlerRegistry, PermanentError, RetryLater
from nexus_pipelines.workqueue.retry import DEFAULT_POLICY, RetryPolicy, summarize_exception


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class DrainReport:
    worker_id: str
    claimed: int = 0
    completed: int = 0
    retried: int = 0
    dead: int = 0
    lost: int = 0
    reclaimed_retry: int = 0
    reclaimed_dead: int = 0
    claim_statements: int = 0
    claim_s: float = 0.0  # time spent in claim statements (round trip included)
    finalize_s: float = 0.0  # time spent in completion / failure statements
    elapsed_s: float = 0.0
    stopped: str = ""

    @property
    def items_per_s(self) -> float:
        return self.completed / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def as_dict(self) -> dict:
        data = asdict(self)
        data["items_per_s"] = round(self.items_per_s, 1)
        for key in ("elapsed_s", "claim_s", "finalize_s"):
            data[key] = round(data[key], 3)
        return data


@contextmanager
def _connection(source: str | ConnectionPool) -> Iterator[Connection]:
    if isinstance(source, ConnectionPool):
        with source.connection() as conn:
            yield conn
    else:
        with connect(source) as conn:
            yield conn


class _Heartbeat(threading.Thread):
    """Renews every held lease each `interval_s` in one statement; flags lost items."""

    def __init__(self, source: str | ConnectionPool, lease_ttl: timedelta, interval_s: float) -> None:
        super().__init__(name="workqueue-heartbeat", daemon=True)
        self._source = source
        self._ttl = lease_ttl
        self._interval = interval_s
        self._held: dict[int, ClaimedItem] = {}
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self.lost: set[tuple[int, int]] = set()  # fences (work_id, token) whose lease was lost
        # held while renewing and while the drain finalizes, so the two never contend
        self.db_lock = threading.Lock()
        self.error: BaseException | None = None

    def hold(self, items: Sequence[ClaimedItem]) -> None:
        with self._lock:
            for item in items:
                self._held[item.work_id] = item

    def release(self, items: Sequence[ClaimedItem]) -> None:
        # only the claim that was finalized: the same work item may be held again under a
        # newer token (lost, reclaimed and claimed again by this drain)
        with self._lock:
            for item in items:
                if self._held.get(item.work_id) is item:
                    del self._held[item.work_id]

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            with _connection(self._source) as conn:
                while not self._halt.wait(self._interval):
                    with self.db_lock:
                        with self._lock:
                            held = list(self._held.values())
                        if not held:
                            continue
                        renewed = claims.renew(conn, (i.fence for i in held), self._ttl)
                        for item in held:
                            if item.work_id not in renewed:
                                item.lease_lost.set()
                                with self._lock:
                                    self.lost.add(item.fence)
                                    if self._held.get(item.work_id) is item:
                                        del self._held[item.work_id]
        except BaseException as exc:  # noqa: BLE001 - surfaced by the drain loop
            self.error = exc
            with self._lock:
                for item in self._held.values():
                    item.lease_lost.set()


Result = tuple[ClaimedItem, "str | None", "BaseException | None"]

# Handlers of a chunk run one after another on one pool thread, so the pool's size
# (`concurrency`) still bounds how many items run at once. Chunks are sized from the
# moving average handler time so that a chunk takes about this long: slow handlers get
# one item per task (full parallelism), fast ones share a task (fewer thread hand-offs).
_CHUNK_TARGET_S = 0.002
_PREFETCH_S = 0.05


def _run_chunk(registry: HandlerRegistry, items: list[ClaimedItem]) -> tuple[list[Result], float]:
    results: list[Result] = []
    started = time.perf_counter()
    for item in items:
        if item.lease_lost.is_set():  # lost while waiting for its turn: do not start it
            results.append((item, None, None))
            continue
        try:
            results.append((item, registry[item.work_type](item), None))
        except BaseException as exc:  # noqa: BLE001 - every handler failure is recorded on the item
            results.append((item, None, exc))
    return results, (time.perf_counter() - started) / max(len(items), 1)


def drain(
    dsn_or_pool: str | ConnectionPool,
    registry: HandlerRegistry,
    *,
    worker_id: str | None = None,
    queue_classes: Sequence[str] | None = None,
    registration_ids: Sequence[str] | None = None,
    max_items: int | None = None,
    time_budget_s: float | None = None,
    claim_batch: int = 100,
    concurrency: int = 1,
    lease_ttl_s: float = 30.0,
    retry_policy: RetryPolicy = DEFAULT_POLICY,
    idle_exit: bool = True,
    poll_interval_s: float = 0.25,
    stop_event: threading.Event | None = None,
    with_payload: bool = True,
) -> DrainReport:
    """Drain due work items of active generations with the registry's handlers."""
    if claim_batch < 1 or concurrency < 1 or lease_ttl_s <= 0:
        raise ValueError("claim_batch, concurrency and lease_ttl_s must be positive")
    report = DrainReport(worker_id=worker_id or default_worker_id())
    ttl = timedelta(seconds=lease_ttl_s)
    started = time.monotonic()
    deadline = started + time_budget_s if time_budget_s is not None else None
    reclaim_every = max(min(lease_ttl_s / 2, 5.0), 0.05)
    fast = registry.all_noop
    work_types = registry.work_types
    results: queue.SimpleQueue = queue.SimpleQueue()
    inflight: dict[tuple[int, int], ClaimedItem] = {}  # by fence: a work item can come back under a new token
    per_item_s: float | None = None  # moving average handler time per item

    with ExitStack() as stack:
        conn = stack.enter_context(_connection(dsn_or_pool))
        heartbeat: _Heartbeat | None = None
        pool: ThreadPoolExecutor | None = None
        if not fast:
            heartbeat = _Heartbeat(dsn_or_pool, ttl, max(lease_ttl_s / 3, 0.05))
            heartbeat.start()
            stack.callback(heartbeat.join, 5)
            stack.callback(heartbeat.stop)
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="wq-handler"))

        def reclaim() -> None:
            rec = claims.reclaim_expired(conn, policy=retry_policy)
            report.reclaimed_retry += rec.retried
            report.reclaimed_dead += rec.dead

        def finalize(done: list[tuple[ClaimedItem, str | None, BaseException | None]]) -> None:
            if heartbeat is None:
                _finalize(done)
                return
            with heartbeat.db_lock:
                _finalize(done)

        def _finalize(done: list[tuple[ClaimedItem, str | None, BaseException | None]]) -> None:
            lost = heartbeat.lost if heartbeat else set()
            ok = [(i, o) for i, o, e in done if e is None and i.fence not in lost and not i.lease_lost.is_set()]
            failed = [(i, e) for i, _, e in done if e is not None and i.fence not in lost and not i.lease_lost.is_set()]
            report.lost += len(done) - len(ok) - len(failed)
            by_outcome: dict[str, list[tuple[int, int]]] = {}
            for item, outcome in ok:
                by_outcome.setdefault(outcome or "succeeded", []).append(item.fence)
            started_finalize = time.perf_counter()
            for outcome, fences in by_outcome.items():
                completed = claims.complete(conn, fences, outcome=outcome)
                report.completed += len(completed)
                report.lost += len(fences) - len(completed)
            if failed:
                failures = [
                    Failure(
                        item.work_id,
                        item.token,
                        "permanent" if isinstance(exc, PermanentError) else type(exc).__name__,
                        summarize_exception(exc),
                        max(retry_policy.delay(item.attempts), exc.delay_s if isinstance(exc, RetryLater) else 0.0),
                        terminal=isinstance(exc, PermanentError),
                    )
                    for item, exc in failed
                ]
                states = claims.finalize_failures(conn, failures)
                report.dead += sum(1 for s in states.values() if s == "dead")
                report.retried += sum(1 for s in states.values() if s == "retry")
                report.lost += len(failures) - len(states)
            report.finalize_s += time.perf_counter() - started_finalize
            if heartbeat:
                heartbeat.release([i for i, _, _ in done])
                lost.difference_update(i.fence for i, _, _ in done)

        reclaim()
        last_reclaim = time.monotonic()
        stopping = ""
        while True:
            now = time.monotonic()
            if not stopping:
                if stop_event is not None and stop_event.is_set():
                    stopping = "stopped"
                elif deadline is not None and now >= deadline:
                    stopping = "time_budget"
                elif max_items is not None and report.claimed >= max_items:
                    stopping = "max_items"
            if heartbeat and heartbeat.error is not None:
                raise RuntimeError("lease heartbeat failed") from heartbeat.error
            if now - last_reclaim >= reclaim_every:
                reclaim()
                last_reclaim = now

            claimed: list[ClaimedItem] = []
            if not stopping:
                if fast:
                    room = claim_batch
                else:
                    # Claimed items wait in-process only as long as the pool needs to reach
                    # them: up to what it finishes in about _PREFETCH_S at the measured handler
                    # speed (at least 2 x concurrency, at most 4 batches), so slow handlers
                    # never hoard items that other drains could run.
                    cap = 2 * concurrency
                    if per_item_s is not None:
                        cap = max(cap, min(4 * claim_batch, int(_PREFETCH_S * concurrency / max(per_item_s, 1e-7))))
                    room = max(min(claim_batch, cap - len(inflight)), 0)
                if max_items is not None:
                    room = min(room, max_items - report.claimed)
                if room > 0:
                    started_claim = time.perf_counter()
                    claimed = claims.claim_batch(
                        conn,
                        owner=report.worker_id,
                        limit=room,
                        lease_ttl=ttl,
                        work_types=work_types,
                        queue_classes=queue_classes,
                        registration_ids=registration_ids,
                        with_payload=with_payload and not fast,
                    )
                    report.claim_s += time.perf_counter() - started_claim
                    report.claim_statements += 1
                    report.claimed += len(claimed)

            if fast:
                if claimed:
                    finalize([(item, None, None) for item in claimed])
                    continue
            else:
                if claimed:
                    heartbeat.hold(claimed)
                    for item in claimed:
                        inflight[item.fence] = item
                    size = 1 if per_item_s is None else max(1, min(len(claimed), int(_CHUNK_TARGET_S / max(per_item_s, 1e-7))))
                    for start in range(0, len(claimed), size):
                        pool.submit(_run_chunk, registry, claimed[start : start + size]).add_done_callback(
                            lambda fut: results.put(fut.result())
                        )
                if inflight:
                    done: list[Result] = []
                    wait = 0.0 if claimed and len(inflight) < concurrency else min(poll_interval_s, 0.05)
                    chunks = []
                    try:
                        chunks.append(results.get(timeout=wait) if wait > 0 else results.get_nowait())
                    except queue.Empty:
                        pass
                    while True:
                        try:
                            chunks.append(results.get_nowait())
                        except queue.Empty:
                            break
                    for chunk_results, chunk_per_item in chunks:
                        done.extend(chunk_results)
                        per_item_s = chunk_per_item if per_item_s is None else 0.8 * per_item_s + 0.2 * chunk_per_item
                    if done:
                        for item, _, _ in done:
                            inflight.pop(item.fence, None)
                        finalize(done)
                    continue

            # nothing in flight
            if stopping:
                break
            if isinstance(claimed, claims.LaneRaceLost):
                continue  # a concurrent claim won a lane: claim again, the queue is not idle
            if not claimed:
                if idle_exit:
                    stopping = "idle"
                    break
                wait = poll_interval_s
                if deadline is not None:
                    wait = min(wait, max(deadline - time.monotonic(), 0))
                if stop_event is not None:
                    stop_event.wait(wait)
                else:
                    time.sleep(wait)
        report.stopped = stopping
    report.elapsed_s = time.monotonic() - started
    return report
