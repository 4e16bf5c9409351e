"""nexus_pipelines.workqueue through its public API: migrations, generation gate, bulk enqueue, drain.

Fencing and lanes on: every item has a source lane (FIFO, one running item per lane)
and a target mutation lane (one running item per lane), LANES of each, crossing (a
source lane writes to a different target lane on each pass; BENCH_NEXUS_LANES=0: no
lane keys); items are claimed by fenced compare-and-swap in batches of CLAIM_BATCH and
completed by fenced batched finalization. The handler is a real (recording) handler, not the registry's `NOOP`
marker: with `NOOP` the drain completes items straight from the claim without calling
anything, so nothing could record the execution (BENCH_NEXUS_HANDLER=noop measures
that path anyway; its verification fails by design).

Hot lane (`setup(..., hot=H)`, the fairness row): the first H of the n items all write
one target lane `hot` (each from a source lane of its own, so only the target lane rule
holds them back), enqueued before the others, so they sit at the front of the claim
order and every claim meets them first. `verify` then also reports the other lanes'
throughput: their count over the database time from the first claim to the last of
them finishing.

Stop rule: `drain(idle_exit=True)` stops on its first empty claim, and with lanes and
several workers a claim comes back empty while work remains (every due lane head is
held by another worker), so workers quit early and one finishes alone. Each worker
instead drains with `idle_exit=False` and a `stop_event` that asks `due_work` whether
anything is left to claim, the rule pgqueuer's drain mode uses too, only when the drain
waits idle (after an empty claim with nothing in flight): a side thread that asked every
20 ms per worker spent more database time than the claims of a hot-lane run, on the two
cores the measured drains use (the raw peer runs no such check).
"""

from __future__ import annotations

import os
import sys
import threading

from nexus_pipelines.control.db import connect
from nexus_pipelines.control.migrations import apply_migrations
from nexus_pipelines.workqueue import generations
from nexus_pipelines.workqueue.handlers import NOOP, HandlerRegistry
from nexus_pipelines.workqueue.receipts import NewWork, enqueue_work_items
from nexus_pipelines.workqueue.stats import due_work
from nexus_pipelines.workqueue.worker import drain

REGISTRATION, REVISION, WORK_TYPE = "bench", 1, "bench_noop"
CLAIM_BATCH = int(os.environ.get("BENCH_NEXUS_CLAIM_BATCH", "100"))
CONCURRENCY = int(os.environ.get("BENCH_NEXUS_CONCURRENCY", "50"))
# BENCH_NEXUS_LANES=0 enqueues the items without lane keys (the hot lane's items keep theirs):
# what the queue costs when no lane rule applies; for diagnosis only.
LANES = int(os.environ.get("BENCH_NEXUS_LANES", "1000"))
POLL_INTERVAL_S = 0.02
# BENCH_NEXUS_HANDLER=noop measures the NOOP fast path (no handler runs, so no effects
# are recorded and verification fails by design); for diagnosis only.
FAST_PATH = os.environ.get("BENCH_NEXUS_HANDLER") == "noop"
OPTIONS = {
    "claim_batch": CLAIM_BATCH,
    "concurrency": CONCURRENCY,
    "source_lanes": LANES,
    "target_lanes": LANES,
    "handler": "NOOP fast path" if FAST_PATH else "recording",
    "idle_exit": False,
    "poll_interval_s": POLL_INTERVAL_S,
}


def target_lane(i: int) -> str:
    """Source lane s(i % LANES) writes to a different target lane on each pass, so lanes cross."""
    return f"t{(7 * (i % LANES) + i // LANES) % LANES}"


HOT_LANE = "hot"


def _work(i: int, hot: int) -> NewWork:
    if i < hot:
        return NewWork(f"bench-{i}", WORK_TYPE, source_lane_key=f"h{i}", target_lane_key=HOT_LANE)
    if not LANES:  # items without lane keys take no part in lane checks
        return NewWork(f"bench-{i}", WORK_TYPE)
    return NewWork(f"bench-{i}", WORK_TYPE, source_lane_key=f"s{i % LANES}", target_lane_key=target_lane(i))


def setup(dsn: str, n: int, hot: int = 0) -> None:
    apply_migrations(dsn)
    with connect(dsn) as conn:
        generations.activate(conn, REGISTRATION, REVISION, recorded_by="bench", route_versions={"bulk": 1})
        items = (_work(i, hot) for i in range(n))
        created = enqueue_work_items(conn, items, registration_id=REGISTRATION, revision=REVISION)
        conn.execute("VACUUM ANALYZE connector_work_items")
        conn.execute("VACUUM ANALYZE connector_outbox_events")
    if created != n:
        raise RuntimeError(f"enqueue_work_items created {created} of {n} items")


class _StopWhenNothingDue(threading.Event):
    """A drain's stop event that is set once no item is left to claim. The drain waits on
    it only when idle, so the check runs then, on a connection of its own, and not while
    the drain has work."""

    def __init__(self, conn) -> None:
        super().__init__()
        self._conn = conn

    def wait(self, timeout: float | None = None) -> bool:
        if not self.is_set() and not any(due_work(self._conn, ["default"], cap=1).values()):
            self.set()
        return super().wait(timeout)


def run_worker(dsn: str, worker_index: int, n: int, start_event) -> list[int]:
    handled: list[int] = []

    def record(item) -> None:  # list.append is atomic under the GIL: safe from the handler threads
        handled.append(item.work_id)

    registry = HandlerRegistry({WORK_TYPE: NOOP if FAST_PATH else record})
    with connect(dsn):  # warm: the first connection of a process pays the imports
        pass
    with connect(dsn) as probe:
        start_event.wait()
        report = drain(
            dsn,
            registry,
            worker_id=f"bench-{worker_index}",
            claim_batch=CLAIM_BATCH,
            concurrency=CONCURRENCY,
            with_payload=False,
            idle_exit=False,
            poll_interval_s=POLL_INTERVAL_S,
            stop_event=_StopWhenNothingDue(probe),
        )
    if report.lost or report.retried or report.dead:
        raise RuntimeError(f"drain reported failures: {report.as_dict()}")
    print(f"[bench] nexus worker {worker_index}: {report.as_dict()}", file=sys.stderr, flush=True)
    return handled


def verify(dsn: str, n: int) -> dict:
    with connect(dsn) as conn:
        total, completed, once, tokens = conn.execute(
            """SELECT count(*), count(*) FILTER (WHERE state = 'completed' AND outcome = 'succeeded'),
                      count(*) FILTER (WHERE attempts = 1), count(DISTINCT lease_token)
                 FROM connector_work_items"""
        ).fetchone()
        # now() is the statement's transaction time: one distinct value per claim / complete statement.
        claims, completes, span = conn.execute(
            """SELECT count(DISTINCT claimed_at), count(DISTINCT finished_at),
                      extract(epoch FROM max(finished_at) - min(claimed_at)) FROM connector_work_items"""
        ).fetchone()
        joined = conn.execute(
            "SELECT count(*) FROM public.bench_effects e JOIN connector_work_items w ON w.work_id = e.job_id"
        ).fetchone()[0]
        others, others_span = conn.execute(
            """SELECT count(*) FILTER (WHERE target_lane_key IS DISTINCT FROM %(hot)s),
                      extract(epoch FROM max(finished_at) FILTER (WHERE target_lane_key IS DISTINCT FROM %(hot)s)
                                         - min(claimed_at))
                 FROM connector_work_items""",
            {"hot": HOT_LANE},
        ).fetchone()
    return {
        "items": total,
        "completed": completed,
        "claimed_once": once,
        "distinct_tokens": tokens,
        "effects_matching_items": joined,
        "claim_statements": claims,
        "complete_statements": completes,
        "db_span_s": round(float(span), 3),
        "other_lane_items": others,
        "other_lanes_items_per_s": round(others / float(others_span), 1) if others and others_span else None,
        "queue_ok": total == n and completed == n and once == n and tokens == n and joined == n,
    }
