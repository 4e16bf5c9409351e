"""GitHub bound to the offset-paging cursor rows: the listing links page numbers only
(`page=N`, as GitHub's pagination guide shows for this listing), never `after=`."""

from datetime import timedelta

import httpx
import pytest

from nexus_pipelines.connectors.core.values import FetchIssuePage
from nexus_pipelines.connectors.github.cursor import GitHubCursor, format_time
from tests.connectors.conformance.suite import _attempt
from nexus_pipelines.local.worlds.github import REPOSITORY_ID, GitHubWorld
from tests.connectors.github.test_adapter import query_of
from tests.connectors.offset_paging import first_page_then_next_request
from tests.connectors.offset_paging import *  # noqa: F403 - the offset-paging rows run here for GitHub


def seconds(values):
    return [timedelta(seconds=v) for v in values]


@pytest.fixture
def world():
    return GitHubWorld(issue_paging="page", on_sim_clock=True)


def test_a_page_two_whole_seconds_wide_is_a_tie_walk_that_follows_the_page_link(world):
    _, first, request = first_page_then_next_request(world, seconds([0] * 5 + [1] * 6))
    assert not first.exhausted and query_of(request)["page"] == "2"


def test_a_wider_page_reanchors_at_a_fresh_first_page_from_its_last_second_minus_one(world):
    start, first, request = first_page_then_next_request(world, seconds([0] * 5 + [2] * 6))
    query = query_of(request)
    assert not first.exhausted and "page" not in query and "If-None-Match" not in request.headers
    assert request.url.path == f"/repositories/{REPOSITORY_ID}/issues"  # rename-safe
    assert query == {"state": "all", "sort": "updated", "direction": "asc", "per_page": "10",
                     "since": format_time(start + timedelta(seconds=1))}
    cursor = GitHubCursor.decode(first.next_cursor)
    assert cursor.since == start + timedelta(seconds=1) and cursor.scan_from is not None and cursor.etag is None


class _LinksByRepositoryName(httpx.BaseTransport):
    """A GitHub whose page links name the repository (`/repos/OWNER/REPO/issues?page=N`)."""

    def __init__(self, inner: httpx.BaseTransport, full_name: str) -> None:
        self.inner, self.full_name = inner, full_name

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        link = response.headers.get("Link")
        if link:
            response.headers["Link"] = link.replace(f"/repositories/{REPOSITORY_ID}/", f"/repos/{self.full_name}/")
        return response


def test_a_reanchored_first_page_is_asked_on_the_path_the_providers_own_links_name(world):
    start = world.state.clock.now() - timedelta(hours=1)
    for n, offset in enumerate(seconds([0] * 5 + [2] * 6)):
        world.add_issue_at(start + offset, title=f"Issue {n}")
    full_name = world.state.repositories[REPOSITORY_ID].full_name
    adapter = world.adapter(transport=_LinksByRepositoryName(world.transport, full_name))
    first = adapter.fetch_page(FetchIssuePage(cursor=None, page_size=10), _attempt())
    world.transport.requests.clear()
    adapter.fetch_page(FetchIssuePage(cursor=first.next_cursor, page_size=10), _attempt())
    (request,) = [r for r in world.transport.requests if r.url.path.endswith("/issues")]
    assert request.url.path == f"/repos/{full_name}/issues" and "page" not in query_of(request)


def test_a_tie_run_of_more_than_a_thousand_on_page_links_is_walked_on_in_the_cursor_form(world):
    run = world.add_issues(1050, same_updated_at=True)  # GitHub refuses page numbers 1,000 rows deep
    tail = spaced(world, 3)
    adapter = world.adapter()
    world.clear_requests()
    issues, tokens = scan(world, adapter, page_size=100)
    assert {i.external_ref for i in issues} == set(run + tail)  # in this very scan: no stall at the run
    queries = list_queries(world)
    refused = [n for n, q in enumerate(queries) if q.get("page") == "11" and "after" not in q]
    assert len(refused) == 1 and queries[refused[0] + 1].get("after") == ""  # then a first page asking for a cursor
    assert all(q.get("after") for q in queries[refused[0] + 2:])  # and GitHub's cursor links after it
    for _ in range(2):  # the walked run is read once more (a page link may have skipped), then the scans end
        world.advance(120)
        again, tokens = scan(world, adapter, page_size=100, cursor=tokens[-1])
    assert not {i.external_ref for i in again} & set(run)
