"""GitLab specifics beyond the shared suite: request shape, moved projects, rate-limit headers,
token scopes, payload strictness, and the cursor's scan rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import pytest

from nexus_pipelines.connectors.core.values import CloseFailure, ExternalIssuePage, FetchFailure, FetchIssuePage
from nexus_pipelines.connectors.gitlab.cursor import GitLabCursor
from nexus_pipelines.local.simulators.gitlab import RateLimit
from nexus_pipelines.local.simulators.http import Fault
from tests.connectors.conformance.suite import _attempt, close_command, executor, scan
from nexus_pipelines.local.worlds.gitlab import PROJECT_ID, GitLabWorld
from nexus_pipelines.local.worlds.tokens import gitlab_token


@pytest.fixture
def world():
    return GitLabWorld()


def fetch(world, cursor=None, page_size=100):
    return world.adapter().fetch_page(FetchIssuePage(cursor=cursor, page_size=page_size), _attempt())


def query_of(request):
    return {k: v[-1] for k, v in parse_qs(urlsplit(str(request.url)).query).items()}


def test_the_listing_asks_for_keyset_pages_in_ascending_update_order(world):
    world.add_issues(3)
    first = fetch(world, page_size=2)
    params = query_of(world.transport.requests[0])
    assert params == {"pagination": "keyset", "order_by": "updated_at", "sort": "asc", "per_page": "2"}
    assert world.transport.requests[0].headers["PRIVATE-TOKEN"] == world.environ["NEXUS_TEST_GITLAB_TOKEN"]
    assert world.transport.requests[0].url.path == f"/api/v4/projects/{PROJECT_ID}/issues"
    second = fetch(world, first.next_cursor, page_size=2)
    assert "cursor" in query_of(world.transport.requests[1])  # the next link, followed as given
    assert second.exhausted
    fetch(world, second.next_cursor, page_size=2)
    assert "updated_after" in query_of(world.transport.requests[2])  # the next scan is incremental


def test_the_next_scan_starts_no_later_than_the_provider_time_the_scan_began(world):
    world.add_issues(3)
    started = world.state.clock.now()
    _, tokens = scan(world, world.adapter(), page_size=2)
    since = GitLabCursor.decode(tokens[-1]).since
    assert since is not None and since <= started


def test_a_moved_project_is_refused_never_followed(world):
    world.add_issues(1)
    world.state.projects[PROJECT_ID].moved_to = 999
    result = fetch(world)
    assert isinstance(result, FetchFailure) and (result.retry_class, result.reason) == ("terminal", "ordinary_4xx")
    assert "HTTP 301" in result.detail and len(world.transport.requests) == 1


def test_a_rate_limit_without_retry_after_waits_until_ratelimit_reset(world):
    world.add_issues(1)
    world.state.rate_limit = RateLimit(limit=1, window_s=60)
    fetch(world)
    result = fetch(world)
    assert isinstance(result, FetchFailure) and result.reason == "throttled" and 0 < result.retry_after_seconds <= 60
    world.state.faults.push("list_issues", Fault(status=429, headers={
        "RateLimit-Reset": str(int(world.state.clock.now().timestamp()) + 30)}))
    world.state.rate_limit = None
    assert 25 <= fetch(world).retry_after_seconds <= 31


def test_a_wait_longer_than_a_day_is_a_throttle_of_a_day_not_a_contract_violation(world):
    world.add_issues(1)
    world.state.faults.push("list_issues", Fault(status=429, headers={"Retry-After": str(3 * 86_400)}))
    result = fetch(world)
    assert isinstance(result, FetchFailure) and (result.reason, result.retry_after_seconds) == ("throttled", 86_400)


def test_the_note_creation_limit_sends_no_headers_writes_nothing_and_waits_at_least_a_minute(world):
    (ref,) = world.add_issues(1)
    world.state.note_rate_limit = RateLimit(limit=0, send_headers=False)
    result = world.adapter().comment_and_close(close_command(ref), _attempt())
    assert isinstance(result, CloseFailure) and result.reason == "throttled" and result.retry_after_seconds == 60
    assert result.write_disposition == "not_written" and world.comments(ref) == []


@pytest.mark.parametrize("scopes, expires, reason", [
    (("read_api",), None, "authorization"),
    (("api",), datetime(2020, 1, 1, tzinfo=UTC), "authentication"),
])
def test_token_scope_and_expiry_are_terminal(scopes, expires, reason):
    world = GitLabWorld(token=gitlab_token("scoped-0123456789abcdefgh"))
    world.state.tokens.clear()
    world.state.add_token(gitlab_token("scoped-0123456789abcdefgh"), PROJECT_ID, scopes=scopes, expires_at=expires)
    (ref,) = world.add_issues(1)
    result, log = executor().close(world.adapter(), close_command(ref))
    assert isinstance(result, CloseFailure) and result.reason == reason and log.attempts == 1


def test_a_revoked_token_fails_the_listing_closed(world):
    world.state.revoke(world.environ["NEXUS_TEST_GITLAB_TOKEN"])
    result = fetch(world)
    assert isinstance(result, FetchFailure) and result.reason == "authentication" and "revoked" in result.detail


def test_an_issue_of_another_project_or_over_limit_fails_the_page(world):
    world.add_issues(1)
    world.state.add_project(5, "other/project")
    other = world.state.add_issue(5, title="foreign")
    world.state.projects[PROJECT_ID].issues[99] = other
    result = fetch(world)
    assert isinstance(result, FetchFailure) and result.reason == "invalid_payload" and "project 5" in result.detail
    del world.state.projects[PROJECT_ID].issues[99]
    world.state.add_issue(PROJECT_ID, title="huge", description="x" * 1_048_577)
    result = fetch(world)
    assert isinstance(result, FetchFailure) and result.reason == "invalid_payload" and "description" in result.detail


def test_incidents_are_ingested_and_other_types_excluded_by_config(world):
    world.state.add_issue(PROJECT_ID, title="an incident", issue_type="incident")
    world.state.add_issue(PROJECT_ID, title="a test case", issue_type="test_case")
    world.state.add_issue(PROJECT_ID, title="a work item type of a newer GitLab", issue_type="requirement")
    page = fetch(world)
    assert isinstance(page, ExternalIssuePage) and [i.title for i in page.issues] == ["an incident"]
    assert page.excluded == 2


def test_a_next_link_to_another_origin_is_refused(world):
    world.add_issues(3)
    world.state.faults.push("list_issues", Fault(status=200, body=[], headers={
        "Link": '<https://evil.example.com/api/v4/projects/1/issues?cursor=x>; rel="next"'}))
    result = fetch(world)
    assert isinstance(result, FetchFailure) and result.reason == "invalid_payload" and "another origin" in result.detail


def test_every_request_timeout_fits_the_attempt_budget(world):
    from nexus_pipelines.connectors.core.values import ConnectorAttempt

    world.add_issues(1)
    world.adapter().fetch_page(FetchIssuePage(cursor=None, page_size=5),
                               ConnectorAttempt(attempt_number=2, deadline_remaining_milliseconds=1500))
    timeouts = world.transport.requests[0].extensions["timeout"]
    assert max(timeouts.values()) <= 1.5


def test_the_cursor_round_trips_and_refuses_garbage():
    cursor = GitLabCursor(seq=4, since=datetime(2026, 1, 1, tzinfo=UTC), scan_from=None,
                          hwm=datetime(2026, 1, 2, tzinfo=UTC), next="/api/v4/projects/1/issues?cursor=abc")
    assert GitLabCursor.decode(cursor.encode()) == cursor
    ended = cursor.after_page(items=[("7", datetime(2026, 1, 3, tzinfo=UTC))], served_at=None, next_link=None,
                              first_page=lambda since: pytest.fail("the scan ended"))
    assert ended.next is None and ended.since == datetime(2026, 1, 3, tzinfo=UTC) - timedelta(seconds=1)
    for bad in ("gl2;n=1", "gl1;n=x;since=-;from=-;hwm=-;next=-", "gl1;n=1;since=yesterday;from=-;hwm=-;next=-",
                "gl1;n=1;since=-;from=-;hwm=-;next=https://evil.example.com/x"):
        with pytest.raises(ValueError):
            GitLabCursor.decode(bad)
