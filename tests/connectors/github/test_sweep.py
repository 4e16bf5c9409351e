"""GitHub through the shared reconciliation-sweep rows (pull requests are excluded items), and
the sweep's conditional requests, which only GitHub offers for its issue listing; on a
listing that links `after=` positions and on one that links page numbers."""

import itertools

import pytest

from nexus_pipelines.local.worlds.github import REPOSITORY_ID, GitHubWorld
from tests.connectors.sweep_suite import *  # noqa: F403 - the shared sweep rows run here for GitHub
from tests.connectors.sweep_suite import JUDGE_ALL, drop_custody, lose_latest_observation, registered

_REPOSITORIES = itertools.count(REPOSITORY_ID)


@pytest.fixture(params=["after", "page"])  # GitHub's keyset links, and a listing that links page numbers
def make_world(request):
    return lambda: GitHubWorld(repository_id=next(_REPOSITORIES), issue_paging=request.param)


def _list_calls(world) -> int:
    return sum(1 for operation, _ in world.requests() if operation == "list")


def _swept_once(plant, world, request, issues: int = 230) -> tuple:
    registration = registered(plant, request)
    refs = world.add_issues(issues)
    world.add_excluded_item()
    plant.sync([registration])
    first = plant.sweep(registration, bounds=JUDGE_ALL)
    assert (first.outcome, first.pages, first.unchanged_pages, first.gaps) == ("complete", 3, 0, [])
    world.clear_requests()
    return registration, refs, world.state.charged_calls


def test_a_second_sweep_of_an_unchanged_repository_is_all_304s_and_costs_no_primary_rate_limit(plant, world, request):
    registration, _, charged = _swept_once(plant, world, request)

    again = plant.sweep(registration, bounds=JUDGE_ALL)
    assert (again.outcome, again.listed, again.excluded, again.gaps) == ("complete", 230, 1, [])
    assert (again.pages, again.unchanged_pages, again.calls, _list_calls(world)) == (3, 3, 3, 3)
    assert world.state.charged_calls - charged == 0


def test_a_page_that_changed_is_read_in_full_and_its_new_version_is_a_gap(plant, world, request):
    registration, refs, charged = _swept_once(plant, world, request)
    changed = refs[150]  # on the second page
    world.update_issue(changed, title="Renamed while no poll ran")

    again = plant.sweep(registration, bounds=JUDGE_ALL)
    assert (again.pages, again.unchanged_pages) == (3, 2)
    assert [(g.external_ref, g.reason) for g in again.gaps] == [(changed, "stale")] and again.reobserved == [changed]
    assert world.state.charged_calls - charged == 2  # the changed page and the gap's read
    third = plant.sweep(registration, bounds=JUDGE_ALL)
    assert (third.unchanged_pages, third.gaps) == (3, [])  # the changed page was kept as read


def test_a_gap_lost_from_custody_is_found_though_every_page_answers_304(plant, pool, world, request):
    registration, refs, _ = _swept_once(plant, world, request)
    dropped, stale = refs[5], refs[205]  # nothing changed at GitHub: every page stays the same
    drop_custody(pool, dropped)
    lose_latest_observation(pool, stale)

    again = plant.sweep(registration, bounds=JUDGE_ALL)
    assert again.unchanged_pages == again.pages == 3
    assert sorted((g.external_ref, g.reason) for g in again.gaps) == sorted([(dropped, "missing"), (stale, "stale")])
    assert sorted(again.reobserved) == sorted([dropped, stale])


def test_a_repository_that_lost_its_last_pages_forgets_them(plant, pool, world, request):
    registration, refs, _ = _swept_once(plant, world, request)
    with pool.connection() as conn:
        kept = conn.execute("SELECT count(*) FROM connector_sweep_pages WHERE revision_id = %s",
                            (registration.revision_id,)).fetchone()[0]
    assert kept == 3
    for ref in refs[100:]:
        world.delete_issue(ref)

    again = plant.sweep(registration, bounds=JUDGE_ALL)
    assert (again.pages, again.unchanged_pages, again.listed) == (2, 1, 100)
    with pool.connection() as conn:
        kept = conn.execute("SELECT count(*) FROM connector_sweep_pages WHERE revision_id = %s",
                            (registration.revision_id,)).fetchone()[0]
    assert kept == 2
