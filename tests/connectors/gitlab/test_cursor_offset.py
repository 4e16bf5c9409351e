"""GitLab bound to the offset-paging cursor rows: a GitLab that does not offer keyset
pagination for issues ignores `pagination=keyset` and answers offset pages."""

from datetime import timedelta

import pytest

from nexus_pipelines.connectors.gitlab.cursor import GitLabCursor, format_time
from nexus_pipelines.local.worlds.gitlab import PROJECT_ID, GitLabWorld
from tests.connectors.gitlab.test_adapter import query_of
from tests.connectors.offset_paging import first_page_then_next_request
from tests.connectors.offset_paging import *  # noqa: F403 - the offset-paging rows run here for GitLab


def milliseconds(values):
    return [timedelta(milliseconds=v) for v in values]


@pytest.fixture
def world():
    return GitLabWorld(keyset_for_issues=False)


def test_a_page_at_one_instant_is_a_tie_walk_that_follows_the_page_link(world):
    _, first, request = first_page_then_next_request(world, milliseconds([5] * 11))
    assert not first.exhausted and query_of(request)["page"] == "2"


def test_a_page_one_millisecond_wide_reanchors_at_a_fresh_first_page_from_its_last_item(world):
    start, first, request = first_page_then_next_request(world, milliseconds([0] * 9 + [1] * 2))
    query = query_of(request)
    assert not first.exhausted and "page" not in query
    assert request.url.path == f"/api/v4/projects/{PROJECT_ID}/issues"
    last = start + timedelta(milliseconds=1)
    # inclusive, millisecond-precise; no `pagination=keyset`: this GitLab pages the listing by offset
    assert query == {"order_by": "updated_at", "sort": "asc", "per_page": "10", "updated_after": format_time(last)}
    cursor = GitLabCursor.decode(first.next_cursor)
    assert cursor.since == last and cursor.scan_from is not None and cursor.next.startswith("/api/v4/projects/")
