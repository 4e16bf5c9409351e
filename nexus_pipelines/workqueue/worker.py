"""The WorkItem drain: claim in batches, run handlers, renew leases, finalize in batches.

One drain is one queue scanner (one claim statement at a time on its own
connection). `concurrency` only sets how many claimed items run at once on a
bounded thread pool; it never adds scanners. While handlers run, a heartbeat thread
renews all held leases in one statement on a second connection, and marks items
whose renewal failed as lost (their `lease_lost` event is set and their results are
discarded). Results are finalized in batches: one fenced statement completes every
finished item, one records every failure; an item lost before its handler started
is handed back as unstarted (so it counts as never dispatched). The items of a
`Batched` work type in one claim go to its handler as a few batches (up to one per
handler thread), in claim order; items such a handler completed in its own effect
transaction (`Completed`) are only counted.

Both connections are `ControlSession`s, both connected when the drain starts (the
heartbeat's before its first beat): a Postgres
restart or a network cut makes the drain reconnect with capped backoff and carry on
(reported through `on_outage`), a drain started during an outage waits for the control
plane the same way, and
a statement that meets a deadlock or lock timeout is retried; what a retried
finalizing statement already did is read back from the database, so no item is lost
or finalized twice. The drain gives up when the outage outlasts its time budget
(plus one lease, to finalize what it holds).

The drain registers itself as a claimant (`claimants.py`) while it runs, so a
rollback can prove that no drain from before its claim stop is still running.

The drain stops when `max_items` items were claimed, the `time_budget_s` is spent
(then it stops claiming and lets running items finish), the queue is idle (with
`idle_exit`), or `stop_event` is set.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import timedelta

from psycopg import Connection
from psycopg_pool import ConnectionPool

from nexus_pipelines.heap import heap_before_frozen
from nexus_pipelines.workqueue import claimants, claims
from nexus_pipelines.workqueue.claims import ClaimedItem
from nexus_pipelines.workqueue.execution import (
    DrainReport,
    Heartbeat,
    HandlerResult,
    StopRule,
    default_worker_id,
    failure_for,
    run_batch,
    run_handler,
)
from nexus_pipelines.workqueue.handlers import Batched, HandlerRegistry
from nexus_pipelines.workqueue.retry import DEFAULT_POLICY, RetryPolicy
from nexus_pipelines.workqueue.session import ControlSession
from nexus_pipelines.workqueue.states import COMPLETED, RUNNING

__all__ = ["DrainReport", "default_worker_id", "drain"]

# Handlers of a chunk run one after another on one pool thread, so the pool's size
# (`concurrency`) still bounds how many items run at once. Chunks are sized from the
# moving average handler time so that a chunk takes about this long: slow handlers get
# one item per task (full parallelism), fast ones share a task (fewer thread hand-offs).
_CHUNK_TARGET_S = 0.002
_PREFETCH_S = 0.05


class _ClaimSizer:
    """How many items to claim and how many one pool task runs, from the handler speed."""

    def __init__(self, claim_batch: int, concurrency: int, fast: bool, batched: bool = False) -> None:
        self._batch = claim_batch
        self._concurrency = concurrency
        self._fast = fast
        self._batched = batched
        self.per_item_s: float | None = None  # moving average handler time per item

    def room(self, inflight: int) -> int:
        if self._fast:
            return self._batch
        # Claimed items wait in-process only as long as the pool needs to reach them: up
        # to what it finishes in about _PREFETCH_S at the measured handler speed (at least
        # 2 x concurrency, at most 4 batches), so slow handlers never hoard items that
        # other drains could run.
        cap = 2 * self._concurrency
        if self.per_item_s is not None:
            cap = max(cap, min(4 * self._batch, int(_PREFETCH_S * self._concurrency / max(self.per_item_s, 1e-7))))
        room = max(min(self._batch, cap - inflight), 0)
        # A batch costs mostly its transaction, not its items: topping up a few items at a
        # time would make many small batches (and a per-item time that keeps them small),
        # so a registry with batched work types claims only once half its room is free.
        if self._batched and inflight and room < min(self._batch, cap) / 2:
            return 0
        return room

    def batch_size(self, items: int) -> int:
        """Items per batch: the claim spread evenly over as many handler threads as get at
        least a thread's share of a full claim each (a small top-up stays one batch, and a
        claim is never cut into a full batch and a small remainder)."""
        batches = max(1, min(self._concurrency, items // max(self._batch // self._concurrency, 1)))
        return max(-(-items // batches), 1)

    def chunk(self, claimed: int) -> int:
        if self.per_item_s is None:
            return 1
        return max(1, min(claimed, int(_CHUNK_TARGET_S / max(self.per_item_s, 1e-7))))

    def observe(self, per_item_s: float) -> None:
        self.per_item_s = per_item_s if self.per_item_s is None else 0.8 * self.per_item_s + 0.2 * per_item_s


class _HeldLeases:
    """The leases held while handlers run; each heartbeat renews all of them in one statement."""

    def __init__(self, lease_ttl: timedelta) -> None:
        self._ttl = lease_ttl
        self._held: dict[int, ClaimedItem] = {}
        self._lock = threading.Lock()
        self.lost: set[tuple[int, int]] = set()  # fences (work_id, token) whose lease was lost

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
            self.lost.difference_update(item.fence for item in items)

    def beat(self, conn: Connection) -> None:
        with self._lock:
            held = list(self._held.values())
        if not held:
            return
        renewed = claims.renew(conn, (i.fence for i in held), self._ttl)
        missing = [i for i in held if i.work_id not in renewed]
        # renewal skips rows someone locked for a moment: those are still held; completed
        # with the item's token means a batch handler completed it with its effects
        still = claims.held(conn, (i.fence for i in missing)) if missing else {}
        for item in missing:
            if still.get(item.work_id) not in (RUNNING, COMPLETED):
                self._lose(item)

    def lose_all(self) -> None:
        with self._lock:
            items = list(self._held.values())
        for item in items:
            self._lose(item)

    def _lose(self, item: ClaimedItem) -> None:
        item.lease_lost.set()
        with self._lock:
            self.lost.add(item.fence)
            if self._held.get(item.work_id) is item:
                del self._held[item.work_id]


class _Finalizer:
    """Records finished items with the fenced batch statements."""

    def __init__(
        self, session: ControlSession, report: DrainReport, policy: RetryPolicy, leases: _HeldLeases | None
    ) -> None:
        self._session = session
        self._report = report
        self._policy = policy
        self._leases = leases

    def __call__(self, results: Sequence[HandlerResult]) -> None:
        lost = self._leases.lost if self._leases else set()
        # a completion the handler committed with its effects stands, whatever a later beat saw
        self._report.completed += sum(1 for r in results if r.completed)
        pending = [r for r in results if not r.completed]
        live = [r for r in pending if r.started and r.item.fence not in lost and not r.item.lease_lost.is_set()]
        unstarted = [r.item.fence for r in pending if not r.started]
        self._report.lost += len(pending) - len(live)
        started = time.perf_counter()
        by_outcome: dict[str, list[tuple[int, int]]] = {}
        for r in live:
            if r.error is None:
                by_outcome.setdefault(r.outcome or "succeeded", []).append(r.item.fence)
        for outcome, fences in by_outcome.items():
            self._complete(fences, outcome)
        failures = [failure_for(r.item, r.error, self._policy) for r in live if r.error is not None]
        if failures:
            states = self._session.run(lambda conn: claims.finalize_failures(conn, failures))
            self._report.dead += sum(1 for s in states.values() if s == "dead")
            self._report.retried += sum(1 for s in states.values() if s == "retry")
            self._report.lost += len(failures) - len(states)
        if unstarted:
            self._session.run(lambda conn: claims.release_unstarted(conn, unstarted))
        self._report.finalize_s += time.perf_counter() - started
        if self._leases:
            self._leases.release([r.item for r in results])

    def _complete(self, fences: list[tuple[int, int]], outcome: str) -> None:
        done = self._session.run(lambda conn: claims.complete(conn, fences, outcome=outcome))
        missing = [f for f in fences if f[0] not in done]
        if missing:  # lost, or completed by an attempt whose answer a reconnect lost
            states = self._session.run(lambda conn: claims.held(conn, missing))
            done = done | {work_id for work_id, state in states.items() if state == COMPLETED}
        self._report.completed += len(done)
        self._report.lost += len(fences) - len(done)


class Drain:
    """One drain run; `drain()` builds and runs it."""

    def __init__(self, source: str | ConnectionPool, registry: HandlerRegistry, **options) -> None:
        self._source = source
        self._registry = registry
        self._opt = options
        self._fast = registry.all_noop
        self.report = DrainReport(worker_id=options["worker_id"] or default_worker_id())
        self._ttl = timedelta(seconds=options["lease_ttl_s"])
        self._stop = StopRule(options["stop_event"], options["time_budget_s"], options["max_items"])
        self._sizer = _ClaimSizer(options["claim_batch"], options["concurrency"], self._fast,
                                  batched=any(isinstance(h, Batched) for h in registry.values()))
        self._tick_every = max(min(options["lease_ttl_s"] / 2, 5.0), 0.05)
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._inflight: dict[tuple[int, int], ClaimedItem] = {}  # by fence: an item can come back under a new token
        self._leases: _HeldLeases | None = None
        self._heartbeat: Heartbeat | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.session = self._session("claims")
        self._finalize = _Finalizer(self.session, self.report, options["retry_policy"], None)

    def _session(self, role: str) -> ControlSession:
        return ControlSession(
            self._source, give_up_at=self._give_up_at, on_outage=self._opt["on_outage"],
            name=f"drain {self.report.worker_id} ({role})",
        )

    def _give_up_at(self) -> float | None:
        deadline = self._stop.deadline
        return deadline + self._opt["lease_ttl_s"] if deadline is not None else None

    def run(self) -> DrainReport:
        with ExitStack() as stack:
            stack.callback(self._close)
            self.session.run(lambda conn: claimants.register(
                conn, self.report.worker_id, self._opt["registration_ids"], self._claimant_ttl))
            if not self._fast:
                self._start_heartbeat(stack)
                self._pool = stack.enter_context(ThreadPoolExecutor(
                    max_workers=self._opt["concurrency"], thread_name_prefix="wq-handler"))
            self._loop()
        self.report.elapsed_s = time.monotonic() - self._stop.started
        return self.report

    @property
    def _claimant_ttl(self) -> timedelta:
        return max(self._ttl, timedelta(seconds=3 * self._tick_every))

    def _start_heartbeat(self, stack: ExitStack) -> None:
        self._leases = _HeldLeases(self._ttl)
        self._finalize = _Finalizer(self.session, self.report, self._opt["retry_policy"], self._leases)
        self._heartbeat = Heartbeat(
            self._session("heartbeat"), self._leases.beat, max(self._opt["lease_ttl_s"] / 3, 0.05),
            on_error=self._leases.lose_all,
        )
        self._heartbeat.start()
        stack.callback(self._heartbeat.join, 5)
        stack.callback(self._heartbeat.stop)

    def _close(self) -> None:
        try:
            self.session.run(lambda conn: claimants.deregister(conn, self.report.worker_id))
        except Exception:  # noqa: BLE001 - an unreachable control plane: the row expires instead
            pass
        self.session.close()
        self.report.add_session(self.session)
        if self._heartbeat is not None:
            self.report.add_session(self._heartbeat.session)

    def _loop(self) -> None:
        self._tick()
        last_tick = time.monotonic()
        stopping = ""
        while True:
            stopping = stopping or self._stop.reason(self.report.claimed)
            if self._heartbeat is not None and self._heartbeat.error is not None:
                raise self._heartbeat.error
            if time.monotonic() - last_tick >= self._tick_every:
                self._tick()
                last_tick = time.monotonic()
            claimed = [] if stopping else self._claim()
            if claimed and self._fast:
                self._finalize([HandlerResult(item) for item in claimed])
                continue
            if claimed:
                self._dispatch(claimed)
            if self._inflight:
                self._collect(wait=0.0 if claimed and len(self._inflight) < self._opt["concurrency"] else
                              min(self._opt["poll_interval_s"], 0.05))
                continue
            if stopping:
                break
            if isinstance(claimed, claims.LaneRaceLost):
                continue  # a concurrent claim won a lane: claim again, the queue is not idle
            if not claimed:
                if self._opt["idle_exit"]:
                    stopping = "idle"
                    break
                self._stop.idle_wait(self._opt["poll_interval_s"])
        self.report.stopped = stopping

    def _tick(self) -> None:
        """Housekeeping: reclaim expired leases, renew this drain's claimant row, drop dead drains' rows."""
        policy = self._opt["retry_policy"]
        rec = self.session.run(lambda conn: claims.reclaim_expired(conn, policy=policy))
        self.report.reclaimed_retry += rec.retried
        self.report.reclaimed_dead += rec.dead
        self.session.run(lambda conn: claimants.renew(conn, self.report.worker_id, self._claimant_ttl))
        self.session.run(claimants.prune_expired)

    def _claim(self) -> list[ClaimedItem]:
        room = self._stop.room(self.report.claimed, self._sizer.room(len(self._inflight)))
        if room <= 0:
            return []
        outages = self.session.outages
        started = time.perf_counter()
        claimed = self.session.run(lambda conn: claims.claim_batch(
            conn, owner=self.report.worker_id, limit=room, lease_ttl=self._ttl,
            work_types=self._registry.work_types, queue_classes=self._opt["queue_classes"],
            registration_ids=self._opt["registration_ids"],
            with_payload=self._opt["with_payload"] and not self._fast,
        ))
        self.report.claim_s += time.perf_counter() - started
        self.report.claim_statements += 1
        self.report.claimed += len(claimed)
        if self.session.outages != outages:
            self._release_orphans(claimed)
        return claimed

    def _release_orphans(self, claimed: Sequence[ClaimedItem]) -> None:
        """A claim whose answer a reconnect lost may have taken items: hand them back unstarted."""
        known = {item.fence for item in claimed} | set(self._inflight)
        owned = self.session.run(lambda conn: claims.running_of(conn, self.report.worker_id))
        orphans = [fence for fence in owned if fence not in known]
        if orphans:
            self.session.run(lambda conn: claims.release_unstarted(conn, orphans))

    def _dispatch(self, claimed: list[ClaimedItem]) -> None:
        self._leases.hold(claimed)
        for item in claimed:
            self._inflight[item.fence] = item
        batched: dict[str, list[ClaimedItem]] = {}
        single: list[ClaimedItem] = []
        for item in claimed:  # claim order, so each batch keeps the lanes' order
            if isinstance(self._registry[item.work_type], Batched):
                batched.setdefault(item.work_type, []).append(item)
            else:
                single.append(item)
        for work_type, items in batched.items():
            size = self._sizer.batch_size(len(items))
            for start in range(0, len(items), size):
                self._submit(_run_batch, self._registry[work_type], items[start : start + size])
        size = self._sizer.chunk(len(single))
        for start in range(0, len(single), size):
            self._submit(_run_chunk, self._registry, single[start : start + size])

    def _submit(self, run, *args) -> None:
        self._pool.submit(run, *args).add_done_callback(lambda fut: self._results.put(fut.result()))

    def _collect(self, wait: float) -> None:
        chunks = []
        try:
            chunks.append(self._results.get(timeout=wait) if wait > 0 else self._results.get_nowait())
        except queue.Empty:
            pass
        while True:
            try:
                chunks.append(self._results.get_nowait())
            except queue.Empty:
                break
        done: list[HandlerResult] = []
        for chunk_results, per_item_s in chunks:
            done.extend(chunk_results)
            self._sizer.observe(per_item_s)
        if not done:
            return
        for result in done:
            self._inflight.pop(result.item.fence, None)
        with self._heartbeat.db_lock:  # never renew and finalize the same rows at once
            self._finalize(done)


def _run_chunk(registry: HandlerRegistry, items: list[ClaimedItem]) -> tuple[list[HandlerResult], float]:
    started = time.perf_counter()
    results = [run_handler(registry, item) for item in items]
    return results, (time.perf_counter() - started) / max(len(items), 1)


def _run_batch(handler: Batched, items: list[ClaimedItem]) -> tuple[list[HandlerResult], float]:
    started = time.perf_counter()
    results = run_batch(handler, items)
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
    on_outage: Callable[[str], None] | None = None,
) -> DrainReport:
    """Drain due work items of active WorkItem-owned generations with the registry's handlers.

    `on_outage` receives one line when a control-plane connection is lost and one when
    it is back.
    """
    if claim_batch < 1 or concurrency < 1 or lease_ttl_s <= 0:
        raise ValueError("claim_batch, concurrency and lease_ttl_s must be positive")
    drainer = Drain(
        dsn_or_pool, registry, worker_id=worker_id, queue_classes=queue_classes, registration_ids=registration_ids,
        max_items=max_items, time_budget_s=time_budget_s, claim_batch=claim_batch, concurrency=concurrency,
        lease_ttl_s=lease_ttl_s, retry_policy=retry_policy, idle_exit=idle_exit, poll_interval_s=poll_interval_s,
        stop_event=stop_event, with_payload=with_payload, on_outage=on_outage,
    )
    with heap_before_frozen():  # no full collection rescans the process's heap during the drain
        return drainer.run()
