"""Polling benchmark: a full issue sync, an unchanged re-poll, a close-back, and the poll sensor.

    python bench/polling.py --provider gitlab [--issues 10000] [--close-backs 1000]

Against a fresh durable embedded Postgres (fsync on; or NEXUS_PG_DSN) and the provider's
simulator in process (its time is measured at the transport and subtracted):

1. full sync of N issues (ties of 50 on one update time) page by page through the
   code location's poll ticks, then route and drain them into tickets;
2. an unchanged re-poll: which rows it writes (receipts, events, work items, observations);
3. proofs for M tickets and the drain that closes them: provider calls per close-back;
4. the poll sensor's evaluation with 100 due registrations on a Postgres-backed Dagster instance.

The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TABLES = ("ingress_receipts", "connector_outbox_events", "connector_work_items", "ticket_observations", "tickets")


class TimedTransport(httpx.BaseTransport):
    """Counts requests by operation and the seconds spent inside the simulator."""

    def __init__(self, inner: httpx.BaseTransport, operation_of) -> None:
        self.inner, self.operation_of = inner, operation_of
        self.seconds = 0.0
        self.calls: dict[str, int] = {}

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        started = time.perf_counter()
        try:
            return self.inner.handle_request(request)
        finally:
            self.seconds += time.perf_counter() - started
            operation = self.operation_of(request)
            self.calls[operation] = self.calls.get(operation, 0) + 1


def _gitlab(issues: int):
    from datetime import timedelta

    from nexus_pipelines.local.simulators.gitlab import GitLabSimulator
    from nexus_pipelines.local.simulators.http import to_sim_request
    from tests.connectors.gitlab.harness import PROJECT_ID, GitLabWorld

    world = GitLabWorld()
    start = world.state.clock.now() - timedelta(days=30)
    for n in range(issues):
        world.state.add_issue(PROJECT_ID, title=f"Issue {n}", description=f"Body {n}", labels=["bug"],
                              updated_at=start + timedelta(seconds=n // 50))  # ties of 50
    names = {"list_issues": "list", "create_note": "comment", "edit_issue": "close", "list_notes": "lookup",
             "get_issue": "read_issue"}

    def operation_of(request):
        return names.get(GitLabSimulator._route(to_sim_request(request))[0], "other")

    return world, operation_of


PROVIDERS = {"gitlab": _gitlab}


def _rows(conn) -> dict[str, int]:
    return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def _sensor_tick_ms(dsn: str, pool, world, folder: Path) -> float:
    from dagster import DagsterInstance, build_sensor_context

    from nexus_pipelines.connectors.core import activation, store
    from nexus_pipelines.connectors.registry import REGISTRY
    from nexus_pipelines.connectors.sensors import connectors_poll_sensor
    from nexus_pipelines.control.resources import ControlPlaneResource
    from nexus_pipelines.local.dagster_home import write_local_home
    from nexus_pipelines.tickets.handlers import route_versions

    with pool.connection() as conn:
        for n in range(100):
            registration = world.registration(key=f"sensor-{n}")
            activation.activate(conn, registration, REGISTRY, recorded_by="bench", route_versions=route_versions(),
                                drain_old=lambda *_: None)
        store.request_poll(conn)
    home = folder / "dagster_home"
    write_local_home(home, dsn)
    instance = DagsterInstance.from_config(str(home))
    resources = {"control_plane": ControlPlaneResource(dsn=dsn)}
    timings = []
    for _ in range(7):
        with build_sensor_context(instance=instance, resources=resources) as context:
            started = time.perf_counter()
            requests = connectors_poll_sensor(context)
            timings.append((time.perf_counter() - started) * 1000)
    assert len(requests) >= 100, len(requests)
    return round(statistics.median(timings[1:]), 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--provider", choices=sorted(PROVIDERS), default="gitlab")
    parser.add_argument("--issues", type=int, default=10_000)
    parser.add_argument("--close-backs", type=int, default=1_000)
    args = parser.parse_args()

    import os

    from nexus_pipelines.connectors.core import store
    from nexus_pipelines.connectors.core.compose import CachedComposer
    from nexus_pipelines.connectors.core.registry import ComposeContext
    from nexus_pipelines.connectors.core.tick import poll
    from nexus_pipelines.connectors.registry import REGISTRY
    from nexus_pipelines.control.db import make_pool
    from nexus_pipelines.control.migrations import apply_migrations
    from nexus_pipelines.local.postgres import EmbeddedPostgres, ensure_database, with_database
    from tests.connectors.support import Plant, executor

    folder = Path(tempfile.mkdtemp(prefix="nexus-bench-polling-"))
    server = None
    if os.environ.get("NEXUS_PG_DSN"):
        admin = os.environ["NEXUS_PG_DSN"]
    else:
        server = EmbeddedPostgres(folder / "pg")  # default settings: fsync on, as in production
        admin = server.start().dsn()
    try:
        ensure_database(admin, "bench_polling")
        dsn = with_database(admin, "bench_polling")
        apply_migrations(dsn)
        pool = make_pool(dsn, max_size=8)
        world, operation_of = PROVIDERS[args.provider](args.issues)
        timed = TimedTransport(world.transport, operation_of)
        plant = Plant(world, pool)
        plant.composer = CachedComposer(REGISTRY, ComposeContext(transport=timed), environ=world.environ)
        plant.handlers = type(plant.handlers)(pool, REGISTRY, plant.composer, executor_factory=executor)
        registration = world.registration(key="bench", page_size=100)
        plant.activate(registration)

        # 1. full sync, page by page
        with pool.connection() as conn:
            started = time.perf_counter()
            report = poll(conn, REGISTRY, plant.composer, owner="bench", executor=executor(),
                          registration_ids=[registration.registration_id], time_budget_s=3600)
            sync_s = time.perf_counter() - started
        pages, sim_s, calls = report.totals["pages"], timed.seconds, timed.calls.get("list", 0)
        started = time.perf_counter()
        plant.route()
        drained = plant.drain([registration.registration_id])
        apply_s = time.perf_counter() - started
        with pool.connection() as conn:
            before = _rows(conn)
            store.request_poll(conn, [registration.registration_id])
            list_before = timed.calls.get("list", 0)
            repoll = poll(conn, REGISTRY, plant.composer, owner="bench", executor=executor(),
                          registration_ids=[registration.registration_id])
            plant.route()
            plant.drain([registration.registration_id])
            after = _rows(conn)
            repoll_calls = timed.calls.get("list", 0) - list_before
            (duplicates,) = conn.execute(
                "SELECT count(*) - count(DISTINCT external_ref) FROM ticket_custody_links").fetchone()
            ticket_ids = [r[0] for r in conn.execute(
                "SELECT ticket_id FROM ticket_custody_links ORDER BY ticket_id LIMIT %s", (args.close_backs,))]
        repoll_writes = sum(after.values()) - sum(before.values())

        # 3. close-back
        for ticket_id in ticket_ids:
            plant.prove(ticket_id, f"bench-{ticket_id}")
        writes_before = timed.calls.get("comment", 0) + timed.calls.get("close", 0) + timed.calls.get("lookup", 0)
        started = time.perf_counter()
        closed = plant.drain([registration.registration_id])
        close_s = time.perf_counter() - started
        close_calls = (timed.calls.get("comment", 0) + timed.calls.get("close", 0) + timed.calls.get("lookup", 0)
                       - writes_before)

        sensor_ms = _sensor_tick_ms(dsn, pool, world, folder)
        pool.close()
    finally:
        if server is not None:
            server.stop()
    result = {
        "provider": args.provider,
        "issues": args.issues,
        "calls": calls,
        "min_calls": math.ceil(args.issues / 100),
        "pages": pages,
        "sync_s": round(sync_s, 2),
        "simulator_s": round(sim_s, 2),
        "per_page_overhead_ms": round((sync_s - sim_s) / max(pages, 1) * 1000, 2),
        "apply_s": round(apply_s, 2),
        "tickets_per_s": round(drained.completed / apply_s, 1) if apply_s else None,
        "repoll_calls": repoll_calls,
        "repoll_issues_seen": repoll.totals["issues_seen"],
        "repoll_writes": repoll_writes,
        "close_backs": closed.completed,
        "close_calls": close_calls,
        "close_calls_per_ticket": round(close_calls / max(closed.completed, 1), 2),
        "close_s": round(close_s, 2),
        "duplicates": duplicates,
        "sensor_tick_ms": sensor_ms,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
