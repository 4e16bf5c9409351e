"""The Jira sweep on a site whose page tokens hold an offset: a deletion of an issue already
listed shifts every later issue back one position, so following the token would skip the
first issue of the next page; the walk goes on from a fresh query bounded by the page's last
creation minute instead, and the sweep still finds a gap there."""

from nexus_pipelines.local.worlds.jira import PROJECT_ID, JiraWorld
from nexus_pipelines.local.worlds.plant import Plant
from tests.connectors.sweep_suite import JUDGE_ALL, drop_custody, sweep_deleting_after_the_first_page


def _offset_world(project_id: int) -> JiraWorld:
    world = JiraWorld(project_id=project_id)
    world.state.offset_page_tokens = True
    return world


def _synced_with_a_lost_custody(pool, world, refs, key: str):
    plant = Plant(world, pool)
    registration = world.registration(key=key)
    plant.activate(registration)
    plant.sync([registration])
    lost = refs[100]  # the first issue of the second page, by creation
    drop_custody(pool, lost)
    return plant, registration, lost


def test_a_deletion_between_offset_token_pages_does_not_hide_the_next_pages_first_issue(pool):
    world = _offset_world(PROJECT_ID + 701)
    refs = []
    for _ in range(5):  # 60 issues a minute
        refs += world.add_issues(60)
        world.advance(60)
    plant, registration, lost = _synced_with_a_lost_custody(pool, world, refs, "jira-sweep-offset-shift")
    report = sweep_deleting_after_the_first_page(plant, world, registration, refs[5])
    assert [(g.external_ref, g.reason) for g in report.gaps] == [(lost, "missing")]
    assert (report.outcome, report.listed) == ("complete", 300)  # the deleted issue was listed before


def test_a_page_created_within_one_minute_follows_the_token_at_one_call_per_page(pool):
    world = _offset_world(PROJECT_ID + 702)
    refs = world.add_issues(250)
    plant, registration, lost = _synced_with_a_lost_custody(pool, world, refs, "jira-sweep-one-minute")

    report = plant.sweep(registration, bounds=JUDGE_ALL)
    assert [(g.external_ref, g.reason) for g in report.gaps] == [(lost, "missing")]
    assert (report.listed, report.pages) == (250, 3)
