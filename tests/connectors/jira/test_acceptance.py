"""Jira through the shared real-Postgres acceptance."""

import itertools

import pytest

from nexus_pipelines.connectors.core import store
from tests.connectors.conformance.acceptance import *  # noqa: F403 - the shared acceptance runs here for Jira
from nexus_pipelines.local.worlds.jira import PROJECT_ID, TIME_ZONE, JiraWorld
from nexus_pipelines.local.worlds.plant import Plant
from tests.connectors.support import counts


@pytest.fixture
def make_world():
    project_ids = itertools.count(PROJECT_ID)
    return lambda: JiraWorld(project_id=next(project_ids))


def test_a_poll_whose_jql_time_zone_is_not_the_profiles_fails_visibly_and_admits_nothing(make_world, pool):
    world = make_world()
    plant = Plant(world, pool)
    registration = world.registration(key="acc-jira-zone", jql_time_zone="Europe/Berlin")  # the profile: Sydney
    plant.activate(registration)
    world.add_issues(3)
    report = plant.poll([registration])
    (tick,) = report.ticks
    assert tick.failure_class == "terminal" and tick.failure.startswith("composition_failed")
    assert "Europe/Berlin" in tick.failure and TIME_ZONE in tick.failure and world.state.calls["search_issues"] == 0
    with pool.connection() as conn:
        (view,) = store.progress(conn, [registration.registration_id])
        assert view.cursor is None and counts(conn, registration)["ingress_receipts"] == 0
    assert "profile time zone is Australia/Sydney" in view.last_failure
