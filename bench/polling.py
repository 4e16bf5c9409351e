"""Polling benchmark: a full issue sync, an unchanged re-poll, a close-back, and the poll sensor.

    python bench/polling.py --provider gitlab|github|jira|both|all [--issues 10000] [--close-backs 200]
                            [--analyze after-poll|none] [--repeat 1]

Against a fresh durable embedded Postgres (fsync on; or NEXUS_PG_DSN) and the provider's
simulator in process (its time is measured at the transport and subtracted):

1. full sync of N issues (ties of 50 on one update time; for Jira, whose JQL bound is a
   minute, 50 inside each minute) page by page through the code location's poll ticks,
   then route and drain them into tickets (`tickets_per_s` over `apply_s`: routing,
   `route_s`, plus the drain, `drain_s`, as a first sync takes them); `first_sync_own_s`
   is the poll's own time (simulator time subtracted) plus `apply_s`. With `--analyze
   after-poll` (the default) the database is analyzed between the poll and the routing, as
   autovacuum has by then in production (the receipts analyzed full, the ticket tables
   empty); `--analyze none` routes and drains on tables never analyzed (`analyze` names
   which). Then N no-op work items drained by the same drain (concurrency, claim batch,
   database, beside the first sync's completed items) give `noop_items_per_s`, so
   `apply_vs_noop` compares across machines;
   `per_page_overhead_ms` is our own time per page of that sync: its wall time less the time
   spent inside the simulator's transport (parsing the request, listing, building the
   response), so what is left is the claim, the HTTP client and provider gate, the adapter's
   parsing and mapping, the seam's checks, the receipts and the commit; it is split into
   `per_page_fetch_own_ms` (the fetch less the simulator) and `per_page_commit_ms` (the page
   commit, which also takes the next claim, less the next page's fetch made while it is in
   flight: that one counts as the next page's fetch); `load_average` is the 1-minute load average when
   the sync starts and when it ends, since on a shared machine the figures follow it, and
   `cpu_steal_pct` the share of the machine's CPU time the host took for other guests during
   the sync and during the apply (a virtual machine's neighbours slow every figure). With
   `--repeat R` the first sync runs R times, each in a fresh database, and its per-page,
   apply and no-op figures are the medians of the R rounds (each round's under
   `first_sync_rounds`; the other figures are the last round's, which the phases below go
   on from): identical code swings by a third from one sync to the next on a shared machine;
2. an unchanged re-poll: which rows it writes (receipts, events, work items, observations);
3. proofs for M tickets and the drain that closes them: provider calls per close-back.
   GitHub's gate spends its documented content budget (80 comments a minute, 500 an
   hour), so the phase waits out the gate's schedule: whenever closes are held it sleeps
   until they are due and drains again (`close_back_gate_wait_s`: the time slept), within
   the schedule the budget sets for M proofs (`close_back_gate_schedule_s`) plus a margin,
   and checks `close_backs` == `proofs`. The simulator enforces GitHub's documented
   content limits meanwhile (`close_back_refusals`: its 403/429 answers, 0 when the gate
   kept every comment inside them). The default M is 200: two minutes of GitHub's
   budget, so the gate is seen at work while `--provider all` stays short (400 would
   wait 4 minutes; past 500 the hourly limit holds the rest for an hour);
4. the reconciliation sweep: once over the complete intake (`sweep_calls_per_10k`: its
   provider calls scaled to 10,000 issues), once more with nothing changed
   (`sweep_repeat_calls`, and `sweep_repeat_304s`: the pages answered "not modified" to the
   validator the first sweep kept, GitHub only), then after 1% of the tickets were dropped
   from custody (their custody and observation rows deleted): how many it found,
   re-observed and restored after a drain, and what it cost;
5. the poll sensor's evaluation with 100 due registrations on a Postgres-backed Dagster instance;
6. the cost of a shift (`shift_rescan_calls`): on offset pages (GitLab without keyset, GitHub
   `page=` links, Jira page tokens holding an offset), a tie run of 250 and a tail read in
   three consecutive scans, once untouched and once with one issue of the run edited while
   the run is walked: the extra list calls the edit costs (`shift_restart_calls`: the same for
   an issue that appears behind the scan's position; `shift_scan_calls` has the counts);
7. GitHub only, the rate-budget run: a sync that needs more requests than GitHub's primary
   budget allows per window, on the simulator's real clock and the real retry executor;
   the run waits for each reset through the durable poll schedule instead of failing or
   hammering (`calls_while_limited` counts requests GitHub would have refused: 0).

Every drain runs until its queue is empty; a phase whose drain leaves work unfinished, or
whose counts are not what it set up (N tickets after the sync, one close-back per proof),
stops the bench with a line naming what is left.

Each provider prints one JSON line; the last line of stdout is one JSON object (with
`both` (GitLab and GitHub) or `all`, every provider's object under its name).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.host import Steal  # noqa: E402 - the project root is on the path from here
from bench.server import bench_server  # noqa: E402

# The one drain configuration every phase uses (the ticket drain and the no-op drain alike).
DRAIN = {"concurrency": 2, "claim_batch": 100}
DRAIN_BUDGET_S = 3600
CLOSE_MARGIN_S = 300  # the close-back drain's own work past the gate's schedule
# 200 close-backs fill GitHub's content budget (80 a minute) twice: the gate holds the 81st
# and the 161st for a minute each (~2 min), well inside its 500 an hour
CLOSE_BACKS = 200
TABLES = ("ingress_receipts", "connector_outbox_events", "connector_work_items", "ticket_observations", "tickets")


class TimedTransport(httpx.BaseTransport):
    """Counts requests by operation and the seconds spent inside the simulator."""

    def __init__(self, inner: httpx.BaseTransport, operation_of) -> None:
        self.inner, self.operation_of = inner, operation_of
        self.seconds = 0.0
        self.calls: dict[str, int] = {}
        self.refusals = 0  # answers 403 or 429: a limit (or permission) refusal

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        started = time.perf_counter()
        try:
            response = self.inner.handle_request(request)
            self.refusals += response.status_code in (403, 429)
            return response
        finally:
            self.seconds += time.perf_counter() - started
            operation = self.operation_of(request)
            self.calls[operation] = self.calls.get(operation, 0) + 1


def _gitlab(issues: int):
    from datetime import timedelta

    from nexus_pipelines.local.simulators.gitlab import GitLabSimulator
    from nexus_pipelines.local.simulators.http import to_sim_request
    from nexus_pipelines.local.worlds.gitlab import PROJECT_ID, GitLabWorld

    world = GitLabWorld()
    start = world.state.clock.now() - timedelta(days=30)
    for n in range(issues):
        world.state.add_issue(PROJECT_ID, title=f"Issue {n}", description=f"Body {n}", labels=["bug"],
                              updated_at=start + timedelta(seconds=n // 50))  # ties of 50
    names = {"list_issues": "list", "create_note": "comment", "edit_issue": "close", "list_notes": "lookup",
             "get_issue": "read_issue"}

    def operation_of(request):
        return names.get(GitLabSimulator.route(to_sim_request(request))[0], "other")

    return world, operation_of


def _github(issues: int, **world_options):
    from datetime import timedelta

    from nexus_pipelines.local.simulators.github import GitHubSimulator
    from nexus_pipelines.local.simulators.http import to_sim_request
    from nexus_pipelines.local.worlds.github import REPOSITORY_ID, GitHubWorld

    world = GitHubWorld(**world_options)
    start = world.state.clock.now() - timedelta(days=30)
    for n in range(issues):
        world.state.add_issue(REPOSITORY_ID, title=f"Issue {n}", body=f"Body {n}", labels=["bug"],
                              updated_at=start + timedelta(seconds=n // 50))  # ties of 50
    names = {"list_issues": "list", "create_comment": "comment", "update_issue": "close", "list_comments": "lookup",
             "get_issue": "read_issue", "create_token": "token"}

    def operation_of(request):
        return names.get(GitHubSimulator.route(to_sim_request(request))[0], "other")

    return world, operation_of


def _jira(issues: int):
    from datetime import timedelta

    from nexus_pipelines.local.simulators.http import to_sim_request
    from nexus_pipelines.local.simulators.jira import JiraSimulator
    from nexus_pipelines.local.worlds.jira import JiraWorld

    world = JiraWorld()
    start = world.state.clock.now() - timedelta(days=30)
    for n in range(issues):
        world.state.add_issue(world.cloud_id, world.project_id, summary=f"Issue {n}", description=f"Body {n}",
                              labels=["bug"], updated_at=start + timedelta(minutes=n // 50, milliseconds=n % 50))
    names = {"search_issues": "list", "add_comment": "comment", "do_transition": "close", "get_comments": "lookup",
             "get_issue": "read_issue", "get_transitions": "transitions"}

    def operation_of(request):
        return names.get(JiraSimulator.route(to_sim_request(request))[0], "other")

    return world, operation_of


PROVIDERS = {"gitlab": _gitlab, "github": _github, "jira": _jira}
# every provider call a close-back makes (a GitHub token mint is not one)
CLOSE_OPERATIONS = ("comment", "close", "lookup", "transitions", "read_issue")


def _rows(conn) -> dict[str, int]:
    return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


class BenchFailure(SystemExit):
    """A phase did not do what it measures; the message names what is left."""


def drain_all(pool, registry, registration_id: str, phase: str):
    """Drain the registration's queue to empty with the bench's drain, or fail naming what is left."""
    from nexus_pipelines.workqueue.worker import drain
    from nexus_pipelines.local.worlds.plant import NO_WAIT

    report = drain(pool, registry, registration_ids=[registration_id], retry_policy=NO_WAIT,
                   time_budget_s=DRAIN_BUDGET_S, **DRAIN)
    left = _unfinished(pool, registration_id)
    if left:
        raise BenchFailure(f"bench: the {phase} drain of {registration_id} ended ({report.stopped}) leaving {left}")
    return report


def _unfinished(pool, registration_id: str) -> str:
    """The registration's work items not completed, by type and state ('' when none)."""
    with pool.connection() as conn:
        left = conn.execute(
            """SELECT work_type, state, count(*) FROM connector_work_items
                WHERE registration_id = %s AND state <> 'completed' GROUP BY 1, 2 ORDER BY 1, 2""",
            (registration_id,)).fetchall()
    return ", ".join(f"{n} {work_type} {state}" for work_type, state, n in left)


def _gate_schedule_s(provider: str, proofs: int) -> float:
    """How long the provider's documented budget holds `proofs` close-backs (one content-creating
    comment each): for every window, the windows after the first that the proofs fill."""
    if provider != "github":
        return 0.0  # GitLab and Jira state no proactive budget
    from nexus_pipelines.connectors.github.limits import CONTENT_BUDGET

    return max((math.ceil(proofs / limit) - 1) * span.total_seconds() for span, limit in CONTENT_BUDGET.windows)


def _documented_write_limits(provider: str, world) -> None:
    """The simulator's documented content limits (GitHub's 80 comments a minute and 500 an hour,
    always on) count on the real clock from here on, as the gate's windows do."""
    if provider == "github":
        from nexus_pipelines.local.simulators.http import SimClock

        world.state.clock = SimClock()  # from the frozen start to now: minutes ahead, nothing expires


def _drain_close_backs(pool, registry, registration_id: str, schedule_s: float):
    """Drain the close-backs to empty, waiting out the provider gate's schedule: a close the gate
    holds is a retry due at the gate's time, so the drain is asked again when it is due, until
    nothing waits. Fails naming what is left past `schedule_s` plus a drain's margin.
    Returns (completed, seconds slept for the gate)."""
    from nexus_pipelines.local.worlds.plant import NO_WAIT
    from nexus_pipelines.workqueue.worker import drain

    give_up = time.monotonic() + schedule_s + CLOSE_MARGIN_S
    completed, waited = 0, 0.0
    while True:
        report = drain(pool, registry, registration_ids=[registration_id], retry_policy=NO_WAIT,
                       time_budget_s=max(give_up - time.monotonic(), 1.0), **DRAIN)
        completed += report.completed
        with pool.connection() as conn:
            (waiting, due_in) = conn.execute(
                """SELECT count(*), extract(epoch FROM min(run_after) - now())::float FROM connector_work_items
                    WHERE registration_id = %s AND work_type = 'issue.close' AND state = 'retry'""",
                (registration_id,)).fetchone()
        left = _unfinished(pool, registration_id)
        if not waiting or time.monotonic() + max(due_in, 0.0) > give_up:
            if left:
                raise BenchFailure(f"bench: the close-back drain of {registration_id} ended ({report.stopped}) "
                                   f"leaving {left}; the gate's schedule for them was {schedule_s:.0f} s "
                                   f"(+{CLOSE_MARGIN_S:.0f} s margin)")
            return completed, round(waited, 1)
        time.sleep(max(due_in, 0.0))
        waited += max(due_in, 0.0)


def _expect(phase: str, what: str, got: int, wanted: int) -> None:
    if got != wanted:
        raise BenchFailure(f"bench: {phase} made {got} {what}, expected {wanted}")


def _noop_items_per_s(pool, items: int) -> float:
    """The bench's drain completing `items` no-op items (one source and one target lane each, like
    ticket.observe) in the same database."""
    from nexus_pipelines.workqueue import generations
    from nexus_pipelines.workqueue.handlers import NOOP, HandlerRegistry
    from nexus_pipelines.workqueue.receipts import NewWork, enqueue_work_items

    registration_id = "bench/noop"
    with pool.connection() as conn:
        generations.activate(conn, registration_id, 1, recorded_by="bench", route_versions={"bulk": 1})
        work = (NewWork(f"noop-{n}", "bench.noop", source_lane_key=f"s{n}", target_lane_key=f"t{n}")
                for n in range(items))
        _expect("the no-op enqueue", "work items", enqueue_work_items(conn, work, registration_id=registration_id,
                                                                      revision=1), items)
    started = time.perf_counter()
    report = drain_all(pool, HandlerRegistry({"bench.noop": NOOP}), registration_id, "no-op")
    seconds = time.perf_counter() - started
    _expect("the no-op drain", "completed items", report.completed, items)
    return round(items / seconds, 1)


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


def plant_world(pool, world, operation_of):
    """The world's plant with its provider calls timed (the simulator's seconds and calls by operation)."""
    from nexus_pipelines.connectors.core.compose import CachedComposer
    from nexus_pipelines.connectors.core.registry import ComposeContext
    from nexus_pipelines.connectors.provider_gate import ProviderGates
    from nexus_pipelines.connectors.registry import REGISTRY
    from nexus_pipelines.local.worlds.plant import Plant, executor

    timed = TimedTransport(world.transport, operation_of)
    plant = Plant(world, pool)
    plant.composer = CachedComposer(REGISTRY, ComposeContext(transport=timed, gates=ProviderGates(pool)),
                                    environ=world.environ)
    plant.handlers = type(plant.handlers)(pool, REGISTRY, plant.composer, executor_factory=executor)
    return plant, timed


def bench_database(admin: str, name: str):
    """A fresh migrated control-plane database `name` on the server of `admin` (one an earlier
    run left on NEXUS_PG_DSN's server is dropped first): its DSN and a pool."""
    from nexus_pipelines.control.db import make_pool
    from nexus_pipelines.control.migrations import apply_migrations
    from nexus_pipelines.local.postgres import drop_database, ensure_database, with_database

    drop_database(admin, name)
    ensure_database(admin, name)
    dsn = with_database(admin, name)
    apply_migrations(dsn)
    return dsn, make_pool(dsn, max_size=8)


GROUPS = {"both": ["github", "gitlab"], "all": sorted(PROVIDERS)}


@dataclass
class FirstSync:
    """One first sync (poll, route, drain) in a database of its own: its figures, and what the
    later phases take over from it."""

    database: str
    dsn: str
    pool: Any
    world: Any
    plant: Any
    timed: TimedTransport
    registration: Any
    figures: dict


# The first sync's figures that --repeat reports as the median of its rounds (each round's own
# under `first_sync_rounds`): on a shared machine one sync's figures swing by a third.
ROUND_FIGURES = ("per_page_overhead_ms", "per_page_fetch_own_ms", "per_page_commit_ms", "route_s", "drain_s",
                 "apply_s", "tickets_per_s", "noop_items_per_s", "apply_vs_noop", "first_sync_own_s")


def first_sync(provider: str, admin: str, args, database: str) -> FirstSync:
    from nexus_pipelines.connectors.core.tick import poll
    from nexus_pipelines.connectors.registry import REGISTRY
    from nexus_pipelines.local.worlds.plant import executor

    dsn, pool = bench_database(admin, database)
    world, operation_of = PROVIDERS[provider](args.issues)
    plant, timed = plant_world(pool, world, operation_of)
    registration = world.registration(key="bench", page_size=100)
    plant.activate(registration)
    with pool.connection() as conn:
        load = [round(os.getloadavg()[0], 2)]
        steal = {"sync": Steal()}
        started = time.perf_counter()
        report = poll(conn, REGISTRY, plant.composer, owner="bench", executor=executor(),
                      registration_ids=[registration.registration_id], time_budget_s=3600)
        sync_s = time.perf_counter() - started
        load.append(round(os.getloadavg()[0], 2))
        steal["sync"] = steal["sync"].pct()
    pages, sim_s, calls = report.totals["pages"], timed.seconds, timed.calls.get("list", 0)
    fetch_s, commit_s = (sum(getattr(t, part) for t in report.ticks) for part in ("fetch_s", "commit_s"))
    if args.analyze == "after-poll":
        with pool.connection() as conn:
            conn.execute("ANALYZE")
    steal["apply"] = Steal()
    started = time.perf_counter()
    plant.route()
    route_s = time.perf_counter() - started
    started = time.perf_counter()
    drained = drain_all(pool, plant.registry(), registration.registration_id, "first sync")
    drain_s = time.perf_counter() - started
    apply_s = route_s + drain_s
    steal["apply"] = steal["apply"].pct()
    with pool.connection() as conn:
        _expect("the first sync", "tickets", _rows(conn)["tickets"], args.issues)
    noop_per_s = _noop_items_per_s(pool, args.issues)
    figures = {
        "calls": calls,
        "min_calls": math.ceil(args.issues / 100),
        "pages": pages,
        "sync_s": round(sync_s, 2),
        "simulator_s": round(sim_s, 2),
        "per_page_overhead_ms": round((sync_s - sim_s) / max(pages, 1) * 1000, 2),
        "per_page_fetch_own_ms": round((fetch_s - sim_s) / max(pages, 1) * 1000, 2),
        "per_page_commit_ms": round(commit_s / max(pages, 1) * 1000, 2),
        "load_average": load,
        "cpu_steal_pct": steal,
        "analyze": args.analyze,
        "route_s": round(route_s, 2),
        "drain_s": round(drain_s, 2),
        "apply_s": round(apply_s, 2),
        "tickets_per_s": round(drained.completed / apply_s, 1) if apply_s else None,
        "noop_items_per_s": noop_per_s,
        "apply_vs_noop": round(drained.completed / apply_s / noop_per_s, 3) if apply_s else None,
        "first_sync_own_s": round(sync_s - sim_s + apply_s, 2),
        "drain": DRAIN,
    }
    return FirstSync(database, dsn, pool, world, plant, timed, registration, figures)


def _first_syncs(provider: str, admin: str, args) -> tuple[FirstSync, dict]:
    """`args.repeat` first syncs, each in a fresh database (an earlier round's is dropped once
    measured); the last one, which the later phases go on from, and the figures to report."""
    from nexus_pipelines.local.postgres import drop_database

    rounds: list[FirstSync] = []
    for n in range(args.repeat):
        if rounds:
            rounds[-1].pool.close()
            drop_database(admin, rounds[-1].database)
        rounds.append(first_sync(provider, admin, args, f"bench_polling_{provider}" + (f"_{n}" if n else "")))
    figures = dict(rounds[-1].figures)
    if len(rounds) > 1:
        figures.update({k: statistics.median(r.figures[k] for r in rounds) for k in ROUND_FIGURES})
        figures["first_sync_rounds"] = [{k: r.figures[k] for k in ROUND_FIGURES} for r in rounds]
    return rounds[-1], figures


def run_provider(provider: str, admin: str, args, folder: Path) -> dict:
    from nexus_pipelines.connectors.core import store
    from nexus_pipelines.connectors.core.tick import poll
    from nexus_pipelines.connectors.registry import REGISTRY
    from nexus_pipelines.local.worlds.plant import executor

    # 1. full sync, page by page, then routed and drained (--repeat times)
    sync, figures = _first_syncs(provider, admin, args)
    dsn, pool, world, plant, timed = sync.dsn, sync.pool, sync.world, sync.plant, sync.timed
    registration = sync.registration
    rid = registration.registration_id

    # 2. an unchanged re-poll
    with pool.connection() as conn:
        before = _rows(conn)
        store.request_poll(conn, [rid])
        list_before = timed.calls.get("list", 0)
        repoll = poll(conn, REGISTRY, plant.composer, owner="bench", executor=executor(), registration_ids=[rid])
        plant.route()
        drain_all(pool, plant.registry(), rid, "re-poll")
        after = _rows(conn)
        repoll_calls = timed.calls.get("list", 0) - list_before
        (duplicates,) = conn.execute(
            "SELECT count(*) - count(DISTINCT external_ref) FROM ticket_custody_links").fetchone()
    repoll_writes = sum(after.values()) - sum(before.values())
    swept = sweep_run(plant, pool, registration, timed)
    with pool.connection() as conn:
        ticket_ids = [r[0] for r in conn.execute(
            "SELECT ticket_id FROM ticket_custody_links ORDER BY ticket_id LIMIT %s", (args.close_backs,))]

    # 3. close-back
    for ticket_id in ticket_ids:
        plant.prove(ticket_id, f"bench-{ticket_id}")
    writes_before = sum(timed.calls.get(op, 0) for op in CLOSE_OPERATIONS)
    _documented_write_limits(provider, world)
    refusals_before = timed.refusals
    started = time.perf_counter()
    schedule_s = _gate_schedule_s(provider, len(ticket_ids))
    close_backs, gate_wait_s = _drain_close_backs(pool, plant.registry(), rid, schedule_s)
    close_s = time.perf_counter() - started
    close_calls = sum(timed.calls.get(op, 0) for op in CLOSE_OPERATIONS) - writes_before
    with pool.connection() as conn:
        (receipts,) = conn.execute("SELECT count(*) FROM ticket_close_receipts").fetchone()
    _expect("the close-back", "close receipts", receipts, len(ticket_ids))
    _expect("the close-back drain", "completed close-backs", close_backs, len(ticket_ids))

    sensor_ms = _sensor_tick_ms(dsn, pool, world, folder / provider)
    pool.close()
    result = {
        "provider": provider,
        "issues": args.issues,
        **figures,
        "repoll_calls": repoll_calls,
        "repoll_issues_seen": repoll.totals["issues_seen"],
        "repoll_writes": repoll_writes,
        "proofs": len(ticket_ids),
        "close_backs": close_backs,
        "close_calls": close_calls,
        "close_calls_per_ticket": round(close_calls / max(close_backs, 1), 2),
        "close_s": round(close_s, 2),
        "close_back_gate_schedule_s": schedule_s,
        "close_back_gate_wait_s": gate_wait_s,
        "close_back_refusals": timed.refusals - refusals_before,
        "duplicates": duplicates,
        "sensor_tick_ms": sensor_ms,
        "sweep_calls_per_10k": round(swept["complete"]["calls"] * 10_000 / max(args.issues, 1), 1),
        "sweep_repeat_calls": swept["repeat"]["calls"],
        "sweep_repeat_304s": swept["repeat"]["unchanged_pages"],
        "sweep": swept,
    }
    result.update(shift_rescan_run(provider))
    if provider == "github":
        result["rate_budget"] = rate_budget_run(admin)
    return result


def _sweep_once(plant, registration, timed) -> dict:
    before = dict(timed.calls)
    started = time.perf_counter()
    report = plant.sweep(registration)
    seconds = time.perf_counter() - started
    calls = {op: n - before.get(op, 0) for op, n in timed.calls.items() if n - before.get(op, 0)}
    return {"outcome": report.outcome, "listed": report.listed, "gaps": len(report.gaps),
            "reobserved": len(report.reobserved), "pages": report.pages, "unchanged_pages": report.unchanged_pages,
            "calls": sum(v for k, v in calls.items() if k != "token"),
            "calls_by_operation": calls, "sweep_s": round(seconds, 2), "refs": [g.external_ref for g in report.gaps]}


def sweep_run(plant, pool, registration, timed, drop_every: int = 100) -> dict:
    """A sweep of the complete intake, the same sweep again with nothing changed, then one
    after every `drop_every`-th ticket lost its custody and observations (the append-only
    triggers are bypassed, as only a restore from an old backup could), then the drain that
    restores them."""
    complete = _sweep_once(plant, registration, timed)
    repeat = _sweep_once(plant, registration, timed)
    _expect("the repeated sweep", "gaps", repeat["gaps"], 0)
    with pool.connection() as conn, conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        dropped = [r[0] for r in conn.execute(
            """DELETE FROM ticket_custody_links WHERE (tenant, registration_key) = (%s, %s) AND ticket_id %% %s = 0
               RETURNING external_ref""", (registration.tenant, registration.key, drop_every)).fetchall()]
        conn.execute("DELETE FROM ticket_observations WHERE external_ref = ANY(%s)", (dropped,))
    lossy = _sweep_once(plant, registration, timed)
    plant.route()
    drain_all(pool, plant.registry(), registration.registration_id, "sweep restore")
    with pool.connection() as conn:
        (restored,) = conn.execute(
            """SELECT count(*) FROM ticket_custody_links WHERE (tenant, registration_key) = (%s, %s)
                  AND external_ref = ANY(%s)""", (registration.tenant, registration.key, dropped)).fetchone()
    found = set(lossy.pop("refs")) & set(dropped)
    complete.pop("refs")
    repeat.pop("refs")
    return {"complete": complete, "repeat": repeat, "dropped": len(dropped), "found": len(found),
            "reobserved": lossy["reobserved"], "restored": restored, "calls": lossy["calls"], "lossy": lossy}


def _offset_world(provider: str):
    """The provider's simulator paging the issue listing by offset."""
    from nexus_pipelines.local.worlds.github import GitHubWorld
    from nexus_pipelines.local.worlds.gitlab import GitLabWorld
    from nexus_pipelines.local.worlds.jira import JiraWorld

    if provider == "gitlab":
        return GitLabWorld(keyset_for_issues=False)
    if provider == "github":
        return GitHubWorld(issue_paging="page", on_sim_clock=True)
    world = JiraWorld()
    world.state.offset_page_tokens = True
    return world


def _list_calls_over_three_scans(provider: str, change: str | None) -> int:
    from datetime import timedelta

    from nexus_pipelines.local.worlds.scans import PAGE, fetch, scan, tie_run_then_tail

    world = _offset_world(provider)
    run, _ = tie_run_then_tail(world)
    adapter = world.adapter()
    world.clear_requests()
    first = fetch(adapter, None)
    if change == "edit":  # an issue already read leaves the run: the rest shift back
        world.update_issue(run[10], title="edited while the run was walked")
    elif change == "appear":  # an issue stamped before the run is listed now: the rest shift on
        world.add_issue_at(world.state.clock.now() - timedelta(days=1), title="listed late")
    _, tokens = scan(adapter, page_size=PAGE, cursor=first.next_cursor)  # the run is longer than a page
    for _ in range(2):  # the scan after it (the re-read) and one more (which must not re-read)
        world.advance(120)
        _, tokens = scan(adapter, page_size=PAGE, cursor=tokens[-1])
    return sum(1 for operation, _ in world.requests() if operation == "list")


def shift_rescan_run(provider: str) -> dict:
    """The list calls one shift under a tie run walked on offset pages costs (see the docstring):
    an edit (back) and, as `shift_restart_calls`, an issue appearing behind the position (on)."""
    calm, edited, appeared = (_list_calls_over_three_scans(provider, c) for c in (None, "edit", "appear"))
    return {"shift_rescan_calls": edited - calm, "shift_restart_calls": appeared - calm,
            "shift_scan_calls": {"no_shift": calm, "one_edit": edited, "one_appearing": appeared}}


def rate_budget_run(admin: str, issues: int = 1500, limit: int = 6, window_s: int = 4) -> dict:
    """A sync of `issues` (one page per 100) on a primary budget of `limit` requests per
    `window_s` seconds, real time: how long it takes, how often it was held back, and how
    many requests reached GitHub while the budget was spent."""
    from nexus_pipelines.connectors.core import store
    from nexus_pipelines.connectors.core.executor import RetryExecutor
    from nexus_pipelines.connectors.core.tick import poll
    from nexus_pipelines.connectors.registry import REGISTRY
    from nexus_pipelines.local.simulators.github import PrimaryLimit
    from nexus_pipelines.local.simulators.gitlab import SimClock

    _, pool = bench_database(admin, "bench_polling_rate_budget")
    world, operation_of = _github(issues, clock=SimClock())  # the simulator on the real clock
    world.state.primary = PrimaryLimit(limit=limit, window_s=window_s)
    plant, timed = plant_world(pool, world, operation_of)
    registration = world.registration(key="rate-budget", page_size=100)
    plant.activate(registration)
    started, ticks, held, exhausted = time.monotonic(), 0, 0, False
    with pool.connection() as conn:
        store.request_poll(conn, [registration.registration_id])
        while not exhausted and time.monotonic() - started < 120:
            report = poll(conn, REGISTRY, plant.composer, owner="bench", executor=RetryExecutor(),
                          registration_ids=[registration.registration_id], time_budget_s=60)
            ticks += len(report.ticks)
            held += sum(1 for t in report.ticks if t.outcome == "failure" and "throttled" in (t.failure or ""))
            terminal = [t.failure for t in report.ticks if t.failure_class == "terminal"]
            assert not terminal, terminal
            exhausted = any(t.exhausted for t in report.ticks)
            (wait,) = conn.execute("SELECT greatest(extract(epoch FROM next_poll_at - now()), 0) FROM "
                                   "connector_progress WHERE registration_key = %s", (registration.key,)).fetchone()
            if not exhausted:
                time.sleep(float(wait) + 0.05)  # the durable schedule, not the poller, decides when
        (tickets,) = conn.execute("SELECT count(*) FROM ingress_receipts WHERE registration_id = %s",
                                  (registration.registration_id,)).fetchone()
    pool.close()
    return {"issues": issues, "budget_per_window": limit, "window_s": window_s, "exhausted": exhausted,
            "list_calls": timed.calls.get("list", 0), "min_calls": math.ceil(issues / 100), "ticks": ticks,
            "held_back_ticks": held, "calls_while_limited": world.state.limited_calls, "issues_received": tickets,
            "elapsed_s": round(time.monotonic() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--provider", choices=[*sorted(PROVIDERS), *GROUPS], default="gitlab")
    parser.add_argument("--issues", type=int, default=10_000)
    parser.add_argument("--close-backs", type=int, default=CLOSE_BACKS)
    parser.add_argument("--analyze", choices=["after-poll", "none"], default="after-poll")
    parser.add_argument("--repeat", type=int, default=1, help="first syncs to take the medians of (>= 1)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be 1 or more")

    providers = GROUPS.get(args.provider, [args.provider])
    results = {}
    with bench_server("polling") as (admin, folder):
        for provider in providers:
            results[provider] = run_provider(provider, admin, args, folder)
            print(json.dumps(results[provider]), flush=True)
    if len(results) > 1:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
