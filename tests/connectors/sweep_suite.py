"""The shared reconciliation-sweep rows for every connector: the provider's simulator, the real
control plane and the code location's own poll, routing, drain and ticket handlers.

A provider binds them with `from tests.connectors.sweep_suite import *` and a `make_world`
fixture returning a factory of fresh worlds with `add_issues`, `add_issue_at` (an issue
stamped at a given time: one older than a finished scan's bound is one the polls never see),
`update_issue`, `add_excluded_item` and `requests()`.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from nexus_pipelines.connectors.core import store
from nexus_pipelines.connectors.core.sweep import SweepBounds
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.local.worlds.plant import Plant
from tests.connectors.support import tickets_by_ref
from nexus_pipelines.local.worlds.plant import accept


@pytest.fixture
def world(make_world):
    return make_world()


@pytest.fixture
def plant(world, pool):
    return Plant(world, pool)


def registered(plant, request):
    registration = plant.world.registration(key="sw-" + str(abs(hash(request.node.name)) % 10**8))
    plant.activate(registration)
    return registration


JUDGE_ALL = SweepBounds(settle_s=0)  # judge every listed issue, however recently it changed


def _missed_by_the_polls(plant, registration) -> str:
    """An issue stamped a day before the scans' bound: every later incremental scan starts after it."""
    world = plant.world
    ref = world.add_issue_at(world.state.clock.now() - timedelta(days=1), title="Filed while the scan looked away")
    plant.sync([registration])
    with plant.pool.connection() as conn:
        assert ref not in tickets_by_ref(conn, registration)
    return ref


def lose_latest_observation(pool, ref: str) -> None:
    """Simulate an observation lost from the control plane (its rows are append-only facts, so
    the loss bypasses their triggers as only a restore from an old backup could)."""
    with pool.connection() as conn, conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute("""DELETE FROM ticket_observations WHERE observation_id =
                        (SELECT max(observation_id) FROM ticket_observations WHERE external_ref = %s)""", (ref,))


def drop_custody(pool, ref: str) -> None:
    """Simulate a custody link lost from the control plane (a restore from an old backup)."""
    with pool.connection() as conn, conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute("DELETE FROM ticket_custody_links WHERE external_ref = %s", (ref,))



def sweep_deleting_after_the_first_page(plant, world, registration, ref: str):
    """A sweep of every listed issue during which `ref`, listed on its first page, is deleted."""
    def delete_a_listed_issue(report) -> None:
        if report.pages == 1:
            world.delete_issue(ref)

    return plant.sweep(registration, bounds=JUDGE_ALL, on_page=delete_a_listed_issue)

def _findings(pool, ref: str) -> list[str]:
    with pool.connection() as conn:
        return [r[0] for r in conn.execute(
            """SELECT f.kind FROM attention_findings f JOIN ticket_custody_links l USING (ticket_id)
                WHERE l.external_ref = %s ORDER BY f.finding_id""", (ref,)).fetchall()]


def _list_calls(world) -> int:
    return sum(1 for operation, _ in world.requests() if operation == "list")


def test_a_sweep_finds_and_reobserves_an_issue_the_polls_never_saw(plant, pool, request):
    registration = registered(plant, request)
    plant.world.add_issues(5)
    plant.sync([registration])
    missed = _missed_by_the_polls(plant, registration)

    report = plant.sweep(registration)
    assert (report.outcome, report.listed) == ("complete", 6)
    assert [(g.external_ref, g.reason) for g in report.gaps] == [(missed, "missing")]
    assert report.reobserved == [missed]
    plant.route()
    plant.drain([registration.registration_id])
    with pool.connection() as conn:
        ticket = tickets_by_ref(conn, registration)[missed]
        (recorded,) = conn.execute("""SELECT gaps, reobserved FROM connector_sweeps WHERE sweep_id = %s""",
                                   (report.sweep_id,)).fetchall()
    assert ticket["title"] == "Filed while the scan looked away" and ticket["observations"] == 1
    assert recorded == (1, 1)
    assert _findings(pool, missed) == ["connector_triage_required", "connector_sweep_gap"]
    with pool.connection() as conn:
        accept(conn, ticket["ticket_id"])  # its commander triages it: both findings are resolved
        assert conn.execute("""SELECT count(*) FROM attention_findings f WHERE ticket_id = %s AND NOT EXISTS
                               (SELECT 1 FROM attention_resolutions r WHERE r.finding_id = f.finding_id)""",
                            (ticket["ticket_id"],)).fetchone()[0] == 0
    again = plant.sweep(registration)
    assert (again.outcome, again.gaps, again.reobserved) == ("complete", [], [])


def test_a_sweep_reobserves_a_newer_version_whose_observation_was_lost(plant, pool, request):
    world = plant.world
    registration = registered(plant, request)
    ref = world.add_issues(3)[1]
    plant.sync([registration])
    world.update_issue(ref, title="Renamed after triage")
    plant.sync([registration])
    lose_latest_observation(pool, ref)

    report = plant.sweep(registration, bounds=JUDGE_ALL)
    assert [(g.external_ref, g.reason) for g in report.gaps] == [(ref, "stale")] and report.reobserved == [ref], report
    plant.route()
    plant.drain([registration.registration_id])
    with pool.connection() as conn:
        assert tickets_by_ref(conn, registration)[ref]["observations"] == 2
    assert plant.sweep(registration, bounds=JUDGE_ALL).gaps == []


def test_a_complete_intake_has_no_gaps_and_costs_one_list_call_per_hundred_items(plant, world, request):
    registration = registered(plant, request)
    world.add_issues(230)
    world.add_excluded_item()
    plant.sync([registration])
    world.clear_requests()

    report = plant.sweep(registration, bounds=JUDGE_ALL)
    assert (report.outcome, report.listed, report.excluded, report.gaps) == ("complete", 230, 1, [])
    pages = math.ceil(231 / 100)
    assert report.pages == pages and _list_calls(world) == pages
    assert report.calls == pages  # no gap, so no issue is read


def test_excluded_items_are_never_gaps(plant, world, request):
    registration = registered(plant, request)
    world.add_issues(2)
    world.add_excluded_item()
    world.add_excluded_item()
    plant.sync([registration])

    report = plant.sweep(registration, bounds=JUDGE_ALL)
    assert (report.listed, report.excluded, report.gaps) == (2, 2, [])


def test_a_version_a_poll_admitted_but_no_drain_applied_yet_is_not_a_gap(plant, pool, world, request):
    registration = registered(plant, request)
    world.add_issues(4)
    plant.poll([registration])  # receipts admitted, not routed or drained

    report = plant.sweep(registration, bounds=JUDGE_ALL)
    assert (report.listed, report.gaps) == (4, [])
    plant.route()
    assert plant.sweep(registration, bounds=JUDGE_ALL).gaps == []  # routed, its work item still pending


def test_a_failed_listing_is_a_recorded_failed_sweep_that_admits_nothing(plant, pool, world, request):
    registration = registered(plant, request)
    world.add_issues(2)
    plant.sync([registration])
    _missed_by_the_polls(plant, registration)
    world.fail_next("list", "authentication")

    report = plant.sweep(registration)
    assert report.outcome == "failed" and "authentication" in report.detail and report.reobserved == []
    with pool.connection() as conn:
        (outcome,) = conn.execute("SELECT outcome FROM connector_sweeps WHERE sweep_id = %s",
                                  (report.sweep_id,)).fetchone()
    assert outcome == "failed"


def test_a_sweep_waits_for_a_held_poll_lease_and_admits_nothing_while_it_is_held(plant, pool, request):
    registration = registered(plant, request)
    plant.world.add_issues(2)
    plant.sync([registration])
    missed = _missed_by_the_polls(plant, registration)
    with pool.connection() as conn:
        held = store.claim_now(conn, REGISTRY, registration.registration_id, owner="a-poll",
                               ttl=timedelta(seconds=60))
    assert held is not None
    busy = plant.sweep(registration, bounds=SweepBounds(lease_wait_s=0.0))
    assert busy.outcome == "lease_busy" and busy.reobserved == [] and [g.external_ref for g in busy.gaps] == [missed]
    with pool.connection() as conn:
        store.release(conn, held)
    assert plant.sweep(registration).reobserved == [missed]


def test_a_change_newer_than_the_settle_window_is_left_to_the_incremental_scans(plant, world, request):
    registration = registered(plant, request)
    world.add_issues(2)
    plant.sync([registration])
    fresh = world.add_issue_at(datetime.now(UTC), title="Filed a moment ago")  # the next poll's to read

    report = plant.sweep(registration)
    assert report.listed == 3 and report.recent >= 1 and report.gaps == []  # (a simulator on today's clock: 3)
    assert [(g.external_ref, g.reason) for g in plant.sweep(registration, bounds=JUDGE_ALL).gaps] == [
        (fresh, "missing")]


def test_a_sweep_stops_at_its_page_bound_and_says_so(plant, world, request):
    registration = registered(plant, request)
    world.add_issues(150)
    plant.sync([registration])

    report = plant.sweep(registration, bounds=SweepBounds(max_pages=1))
    assert (report.outcome, report.pages, report.listed) == ("partial", 1, 100)
    assert "page bound" in report.detail


def test_an_observation_lost_again_after_a_sweep_restored_it_is_restored_by_the_next_sweep(plant, pool, world,
                                                                                            request):
    registration = registered(plant, request)
    stale = world.add_issues(30)[7]
    plant.sync([registration])
    for _ in range(2):  # the same version lost twice: each sweep admits it again, none refuses it as seen
        lose_latest_observation(pool, stale)
        report = plant.sweep(registration, bounds=JUDGE_ALL)
        assert [(g.external_ref, g.reason) for g in report.gaps] == [(stale, "stale")]
        assert report.reobserved == [stale]
        plant.route()
        plant.drain([registration.registration_id])
        assert plant.sweep(registration, bounds=JUDGE_ALL).gaps == []


def test_custody_and_observations_lost_between_two_sweeps_are_gaps_of_the_second(plant, pool, world, request):
    registration = registered(plant, request)
    dropped, stale = world.add_issues(150)[20:22]
    plant.sync([registration])
    assert plant.sweep(registration, bounds=JUDGE_ALL).gaps == []
    drop_custody(pool, dropped)
    lose_latest_observation(pool, stale)  # the issue is unchanged at the provider: its page is the same

    report = plant.sweep(registration, bounds=JUDGE_ALL)
    assert sorted((g.external_ref, g.reason) for g in report.gaps) == sorted([(dropped, "missing"), (stale, "stale")])
    assert sorted(report.reobserved) == sorted([dropped, stale])
