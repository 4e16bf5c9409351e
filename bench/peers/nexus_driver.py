"""nexus_pipelines.workqueue through its public API: migrations, generation gate, bulk enqueue, drain.

Fencing and lanes on: every item has a source lane (FIFO, one running item per lane)
and a target mutation lane (one running item per lane), spread over LANES lanes each,
and is claimed by fenced compare-and-swap in batches of CLAIM_BATCH and completed by
fenced batched finalization. The handler is a real (recording) handler, not the
registry's `NOOP` marker: `NOOP` makes the drain complete items straight from the
claim without calling anything, so nothing could record the execution; the
recording handler keeps the effect accounting identical to the peers'.
`drain(claim_batch=B)` only claims up to `2 * concurrency - in_flight` items for
real handlers, so CONCURRENCY must be >= B / 2 for full batches.
"""

from __future__ import annotations

import os
import sys

from nexus_pipelines.control.db import connect
from nexus_pipelines.control.migrations import apply_migrations
from nexus_pipelines.workqueue import generations
from nexus_pipelines.workqueue.handlers import NOOP, HandlerRegistry
from nexus_pipelines.workqueue.receipts import NewWork, enqueue_work_items
from nexus_pipelines.workqueue.worker import drain

REGISTRATION, REVISION, WORK_TYPE = "bench", 1, "bench_noop"
CLAIM_BATCH = int(os.environ.get("BENCH_NEXUS_CLAIM_BATCH", "100"))
CONCURRENCY = int(os.environ.get("BENCH_NEXUS_CONCURRENCY", "50"))
LANES = int(os.environ.get("BENCH_NEXUS_LANES", "1000"))
# BENCH_NEXUS_HANDLER=noop measures the NOOP fast path (no handler runs, so no effects
# are recorded and verification fails by design); for diagnosis only.
FAST_PATH = os.environ.get("BENCH_NEXUS_HANDLER") == "noop"
OPTIONS = {
    "claim_batch": CLAIM_BATCH,
    "concurrency": CONCURRENCY,
    "source_lanes": LANES,
    "target_lanes": LANES,
    "handler": "NOOP fast path" if FAST_PATH else "recording",
}


def setup(dsn: str, n: int) -> None:
    apply_migrations(dsn)
    with connect(dsn) as conn:
        generations.activate(conn, REGISTRATION, REVISION, recorded_by="bench", route_versions={"bulk": 1})
        # Target lanes use a different stride than source lanes so the two lane sets cross.
        items = (
            NewWork(f"bench-{i}", WORK_TYPE, source_lane_key=f"s{i % LANES}", target_lane_key=f"t{(i * 7) % LANES}")
            for i in range(n)
        )
        created = enqueue_work_items(conn, items, registration_id=REGISTRATION, revision=REVISION)
        conn.execute("VACUUM ANALYZE connector_work_items")
        conn.execute("VACUUM ANALYZE connector_outbox_events")
    if created != n:
        raise RuntimeError(f"enqueue_work_items created {created} of {n} items")


def run_worker(dsn: str, worker_index: int, n: int, start_event) -> list[int]:
    handled: list[int] = []

    def record(item) -> None:  # list.append is atomic under the GIL: safe from the handler threads
        handled.append(item.work_id)

    registry = HandlerRegistry({WORK_TYPE: NOOP if FAST_PATH else record})
    with connect(dsn):  # warm: the first connection of a process pays the imports
        pass
    start_event.wait()
    try:
        report = drain(
            dsn,
            registry,
            worker_id=f"bench-{worker_index}",
            claim_batch=CLAIM_BATCH,
            concurrency=CONCURRENCY,
            with_payload=False,
        )
    except TypeError as exc:
        # Known bug in workqueue/worker.py: `_Heartbeat` (a Thread) stores an Event in
        # `self._stop`, shadowing `Thread._stop()`, so `heartbeat.join()` raises on the
        # way out of every drain with real handlers, after the loop has finished. The
        # DrainReport is lost; verify() still checks every item in the database.
        if "'Event' object is not callable" not in str(exc):
            raise
        print(f"nexus worker {worker_index}: drain raised on exit ({exc}); heartbeat join bug, see "
              "bench/peers/nexus_driver.py", file=sys.stderr, flush=True)
        return handled
    if report.lost or report.retried or report.dead:
        raise RuntimeError(f"drain reported failures: {report.as_dict()}")
    return handled


def verify(dsn: str, n: int) -> dict:
    with connect(dsn) as conn:
        total, completed, once, tokens = conn.execute(
            """SELECT count(*), count(*) FILTER (WHERE state = 'completed' AND outcome = 'succeeded'),
                      count(*) FILTER (WHERE attempts = 1), count(DISTINCT lease_token)
                 FROM connector_work_items"""
        ).fetchone()
        joined = conn.execute(
            "SELECT count(*) FROM public.bench_effects e JOIN connector_work_items w ON w.work_id = e.job_id"
        ).fetchone()[0]
    return {
        "items": total,
        "completed": completed,
        "claimed_once": once,
        "distinct_tokens": tokens,
        "effects_matching_items": joined,
        "queue_ok": total == n and completed == n and once == n and tokens == n and joined == n,
    }
