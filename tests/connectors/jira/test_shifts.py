"""Jira bound to the shift rows, on a site whose page token holds an offset, plus the loss
the search index's lag makes there: an issue stamped before a scan that becomes searchable
during it appears behind the scan's position."""

from datetime import timedelta

import pytest

from nexus_pipelines.connectors.core import store
from nexus_pipelines.connectors.core.tick import poll
from nexus_pipelines.connectors.jira.cursor import JiraCursor
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.connectors.scan_cursor import MAX_SHIFT_RESTARTS
from nexus_pipelines.local.worlds.jira import JiraWorld
from nexus_pipelines.local.worlds.plant import Plant
from tests.connectors.conformance.suite import executor, scan
from tests.connectors.shifts import *  # noqa: F403 - the shift rows run here for Jira
from tests.connectors.shifts import PAGE, RUN, fetch, refs_of, tie_run_then_tail
from tests.connectors.support import tickets_by_ref


@pytest.fixture
def world():
    world = JiraWorld()
    world.state.offset_page_tokens = True
    return world


def test_an_issue_indexed_late_behind_the_scans_position_restarts_the_scan_and_is_read(world):
    late = world.add_issue_at(world.state.clock.now() - timedelta(hours=2), title="indexed late")
    run, tail = tie_run_then_tail(world)
    world.index_late(late, world.state.clock.now() + timedelta(seconds=30))  # not searchable yet
    adapter = world.adapter()
    first = fetch(adapter, None)
    world.advance(60)  # the index catches up: the issue appears before everything read so far
    second = fetch(adapter, first.next_cursor)
    restarted = JiraCursor.decode(second.next_cursor)
    assert second.rescan and not second.exhausted and restarted.next is None and restarted.watch.restarts == 1
    rest, _ = scan(world, adapter, page_size=PAGE, cursor=second.next_cursor)
    assert refs_of([*first.issues, *second.issues, *rest]) == set(run + tail + [late])


def test_issues_indexed_late_on_every_page_repeat_a_scan_a_bounded_number_of_times_and_lose_nothing(world):
    # on the run's own update time with lower ids, so every repeated scan's pages stay a tie walk (a late
    # issue older than a re-anchored query's bound shifts nothing, and past the overlap is the sweep's)
    stamped = world.state.clock.now()
    late = [world.add_issue_at(stamped, title=f"indexed late {n}") for n in range(8)]
    run, tail = tie_run_then_tail(world)
    for n, ref in enumerate(late):  # one more becomes searchable during every page the poll reads
        world.index_late(ref, world.state.clock.now() + timedelta(seconds=30 * n + 15))
    adapter = world.adapter()
    delivered, cursor, calls = [], None, 0
    while True:  # one poll: pages until the scan says it is done
        page = fetch(adapter, cursor)
        calls += 1
        delivered += page.issues
        cursor = page.next_cursor
        if page.exhausted:
            break
        world.advance(30)
    pages = -(-(RUN + len(tail)) // PAGE)
    assert calls <= (MAX_SHIFT_RESTARTS + 1) * pages, calls  # bounded: the poll ends
    assert JiraCursor.decode(cursor).since is None  # and its cursor did not move past what it may have skipped
    world.advance(600)
    again, _ = scan(world, adapter, page_size=PAGE, cursor=cursor)  # the next poll
    assert refs_of([*delivered, *again]) == set(run + tail + late)


def test_a_poll_counts_the_scans_a_shift_repeated_and_the_issue_becomes_a_ticket(world, pool):
    late = world.add_issue_at(world.state.clock.now() - timedelta(hours=2), title="indexed late")
    run, tail = tie_run_then_tail(world)
    world.index_late(late, world.state.clock.now() + timedelta(seconds=30))
    plant = Plant(world, pool)
    registration = world.registration(key="shifts")
    plant.activate(registration)
    rid = registration.registration_id
    with pool.connection() as conn:
        store.request_poll(conn, [rid])
        report = poll(conn, REGISTRY, plant.composer, owner="test-poller", executor=executor(),
                      registration_ids=[rid], on_tick=lambda tick: world.advance(60))
    plant.route()
    plant.drain([rid])
    assert report.totals["shift_rescans"] == 1  # in the poll run's metadata
    with pool.connection() as conn:
        assert set(tickets_by_ref(conn, registration)) == set(run + tail + [late])
