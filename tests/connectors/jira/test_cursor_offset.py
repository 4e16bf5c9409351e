"""Jira bound to the offset-paging cursor rows, on a site whose `nextPageToken` holds an
offset (Atlassian documents the token as opaque, so the poll never trusts it for a walk
longer than one update minute): an update or a deletion between two pages shifts the later
issues back one position, and the poll re-anchors at a fresh query from the page's last
update minute instead of following the token."""

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from nexus_pipelines.connectors.core import store
from nexus_pipelines.connectors.core.tick import poll
from nexus_pipelines.connectors.jira.cursor import JiraCursor
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.local.worlds.jira import JiraWorld
from nexus_pipelines.local.worlds.plant import Plant
from tests.connectors.conformance.suite import executor
from tests.connectors.offset_paging import spaced
from tests.connectors.support import tickets_by_ref
from tests.connectors.offset_paging import *  # noqa: F403 - the offset-paging rows run here for Jira


@pytest.fixture
def world():
    world = JiraWorld()
    world.state.offset_page_tokens = True
    return world


def test_a_token_without_an_anchor_still_decodes_and_an_anchored_one_round_trips():
    old = "jr1;n=3;since=2026-11-01T09:00:00.000Z;from=2026-11-01T09:10:00.000Z;hwm=-;at=-;next=tok"
    assert JiraCursor.decode(old).anchor is None and JiraCursor.decode(old).bound == JiraCursor.decode(old).since
    anchored = replace(JiraCursor.decode(old), anchor=datetime(2026, 11, 1, 9, 5, tzinfo=UTC))
    assert JiraCursor.decode(anchored.encode()) == anchored and anchored.bound == anchored.anchor


def test_a_poll_admits_every_remaining_issue_though_one_already_read_is_deleted_between_two_pages(world, pool):
    refs = spaced(world, 250)  # a minute apart: the poll's pages span many minutes
    plant = Plant(world, pool)
    registration = world.registration(key="offset-deletion", page_size=100)
    plant.activate(registration)
    rid = registration.registration_id

    def delete_a_read_issue(tick) -> None:  # after the first page: the rest shift up one position
        if tick.issues and not deleted:
            world.delete_issue(refs[5])
            deleted.append(refs[5])

    deleted: list[str] = []

    with pool.connection() as conn:
        store.request_poll(conn, [rid])
        report = poll(conn, REGISTRY, plant.composer, owner="test-poller", executor=executor(),
                      registration_ids=[rid], on_tick=delete_a_read_issue)
    assert deleted and report.ticks[-1].exhausted
    assert {ref for tick in report.ticks for ref in tick.admitted_refs} == set(refs)  # in this very poll
    plant.route()
    plant.drain([rid])
    with pool.connection() as conn:
        assert set(tickets_by_ref(conn, registration)) == set(refs)  # the deleted one was admitted before
