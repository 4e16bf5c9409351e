"""The GitHub sweep of a repository whose listing links page numbers (`page=N`): asked for the
cursor form, it walks `after=` positions, so it gets past GitHub's deep-page limit (page
numbers 1,000 rows deep are refused with 422) and a deletion between two requests shifts no
unread issue onto a page already read."""

from nexus_pipelines.local.simulators.github import DEEP_PAGE_ROWS
from nexus_pipelines.local.worlds.github import REPOSITORY_ID, GitHubWorld
from nexus_pipelines.local.worlds.plant import Plant
from tests.connectors.sweep_suite import JUDGE_ALL, drop_custody, sweep_deleting_after_the_first_page


def _synced(pool, repository_id: int, issues: int, key: str):
    world = GitHubWorld(repository_id=repository_id, issue_paging="page")
    refs = world.add_issues(issues)
    plant = Plant(world, pool)
    registration = world.registration(key=key)
    plant.activate(registration)
    plant.sync([registration])
    return world, plant, registration, refs


def test_a_page_mode_repository_deeper_than_githubs_page_limit_is_swept_in_full(pool):
    world, plant, registration, refs = _synced(pool, REPOSITORY_ID + 801, DEEP_PAGE_ROWS + 50, "gh-sweep-deep")
    lost = refs[DEEP_PAGE_ROWS + 20]  # past the last page GitHub would give by number
    drop_custody(pool, lost)

    report = plant.sweep(registration, bounds=JUDGE_ALL)
    assert (report.outcome, report.listed, report.pages) == ("complete", DEEP_PAGE_ROWS + 50, 11), report.detail
    assert [(g.external_ref, g.reason) for g in report.gaps] == [(lost, "missing")]


def test_a_deletion_between_page_mode_listing_requests_does_not_hide_the_next_pages_first_issue(pool):
    world, plant, registration, refs = _synced(pool, REPOSITORY_ID + 802, 250, "gh-sweep-shift")
    lost = refs[100]  # the first issue of the second page, by creation
    drop_custody(pool, lost)
    report = sweep_deleting_after_the_first_page(plant, world, registration, refs[5])
    assert [(g.external_ref, g.reason) for g in report.gaps] == [(lost, "missing")]
    assert (report.outcome, report.listed) == ("complete", 250)  # the deleted issue was listed before
