"""GitHub specifics beyond the shared suite: request shape, App credentials and their custody,
token refresh, pull requests, renamed repositories, rate limits, conditional requests and
the cursor's scan rules."""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import jwt
import pytest
from pydantic import BaseModel, SecretStr

from nexus_pipelines.connectors.core.compose import compose
from nexus_pipelines.connectors.core.registry import ComposeContext, ConnectorRegistry
from nexus_pipelines.connectors.core.values import CloseFailure, ExternalIssuePage, FetchFailure, FetchIssuePage
from nexus_pipelines.connectors.github import SPEC
from nexus_pipelines.connectors.github import adapter as adapter_module
from nexus_pipelines.connectors.github.adapter import GitHubConnector, GitHubCredentialsRefused, build
from nexus_pipelines.connectors.github.cursor import GitHubCursor
from nexus_pipelines.connectors.provider_gate import ProviderGates
from nexus_pipelines.connectors.provider_http import Deadline
from nexus_pipelines.connectors.rate_limits import MAX_RESET_WAIT_S, RESET_SLACK_S
from nexus_pipelines.local.simulators.github import PrimaryLimit, SecondaryLimit, issue_payload
from nexus_pipelines.local.simulators.http import Fault
from tests.connectors.conformance.suite import _attempt, close_command, executor, scan
from nexus_pipelines.local.worlds.github import API_URL, APP_ID, INSTALLATION_ID, REPOSITORY_ID, GitHubWorld
from nexus_pipelines.local.worlds.github_keys import new_key_pair


@pytest.fixture
def world():
    return GitHubWorld()


def on_sim_clock(world, gates=None):
    """The adapter composed with the simulator's clock as its own, for tests that move time."""
    row = dataclasses.replace(SPEC, build=functools.partial(build, clock=lambda: world.state.clock.now().timestamp()))
    return compose(world.registration(), ConnectorRegistry([row]),
                   ComposeContext(transport=world.transport, gates=gates), environ=world.environ)


def gates_of(pool):
    """The control plane's provider gates, none held yet."""
    with pool.connection() as conn:
        conn.execute("DELETE FROM provider_gates")
    return ProviderGates(pool)


def pass_the_held_time(world, pool, seconds):
    """The world's clock and the database's view of every gate move on by `seconds`."""
    world.advance(seconds)
    with pool.connection() as conn:
        conn.execute("UPDATE provider_gates SET held_until = held_until - make_interval(secs => %s)", (seconds,))


def fetch(adapter, cursor=None, page_size=100):
    return adapter.fetch_page(FetchIssuePage(cursor=cursor, page_size=page_size), _attempt())


def query_of(request):
    return {k: v[-1] for k, v in parse_qs(urlsplit(str(request.url)).query).items()}


def ops(world):
    return [op for op, _ in world.requests()]


def test_composition_mints_a_token_narrowed_to_the_repository_with_a_valid_app_jwt(world):
    world.adapter()
    (mint,) = world.transport.requests
    assert mint.url.path == f"/app/installations/{INSTALLATION_ID}/access_tokens"
    assert json.loads(mint.content) == {"repository_ids": [REPOSITORY_ID],
                                        "permissions": {"issues": "write", "metadata": "read"}}
    signed = mint.headers["Authorization"].removeprefix("Bearer ")
    public = world.state.apps[APP_ID].public_keys[0]
    claims = jwt.decode(signed, public, algorithms=["RS256"], options={"verify_exp": False, "verify_iat": False})
    assert claims["iss"] == str(APP_ID) and claims["exp"] - claims["iat"] <= 600
    assert jwt.get_unverified_header(signed)["alg"] == "RS256"
    (token,) = world.state.tokens.values()
    assert token.repository_ids == [REPOSITORY_ID] and token.permissions == {"issues": "write", "metadata": "read"}


@pytest.mark.parametrize("server_ahead_s", [-120, -61, 541, 3600])  # the local clock 120 s ahead ... an hour behind
def test_a_skewed_local_clock_signs_again_once_on_githubs_clock_and_polls(server_ahead_s):
    world = GitHubWorld(server_clock_skew_s=server_ahead_s)
    adapter = world.adapter()  # composition mints: refused once on the local clock, then signed on GitHub's
    assert ops(world) == ["create_token", "create_token"] and len(world.state.tokens) == 1
    first, second = (jwt.decode(r.headers["Authorization"].removeprefix("Bearer "), options={"verify_signature": False})
                     for r in world.transport.requests)
    server_now = world.state.clock.now().timestamp()
    assert not first["iat"] <= server_now < first["exp"] <= server_now + 600  # invalid on GitHub's clock
    assert second["iat"] <= server_now < second["exp"] <= server_now + 600  # valid on GitHub's clock
    world.add_issues(2)
    page = fetch(adapter)
    assert isinstance(page, ExternalIssuePage) and len(page.issues) == 2


def test_a_401_to_a_jwt_signed_on_githubs_own_clock_is_not_signed_again(world):
    world.state.apps[APP_ID].public_keys.clear()  # the App's key was removed: every JWT is refused
    with pytest.raises(GitHubCredentialsRefused, match="HTTP 401"):
        world.adapter()
    assert ops(world) == ["create_token"]  # the 401's Date shows no skew: a bad key is not signed again


def test_the_listing_asks_for_every_state_by_update_time_ascending_and_follows_next_links(world):
    world.add_issues(3)
    adapter = world.adapter()
    world.clear_requests()
    first = fetch(adapter, page_size=2)
    request = world.transport.requests[0]
    assert query_of(request) == {"state": "all", "sort": "updated", "direction": "asc", "per_page": "2"}
    assert request.url.path == f"/repos/acme/platform-{REPOSITORY_ID}/issues"
    assert request.headers["Authorization"].startswith("Bearer ghs_") and request.headers["User-Agent"]
    assert request.headers["X-GitHub-Api-Version"] == "2022-11-28"
    second = fetch(adapter, first.next_cursor, page_size=2)
    followed = world.transport.requests[1]
    assert "after" in query_of(followed) and followed.url.path == f"/repositories/{REPOSITORY_ID}/issues"
    assert second.exhausted and [i.title for i in first.issues + second.issues] == ["Issue 0", "Issue 1", "Issue 2"]
    fetch(adapter, second.next_cursor, page_size=2)
    since = query_of(world.transport.requests[2])["since"]
    assert since.endswith("Z") and len(since) == len("2026-01-01T00:00:00Z")  # whole seconds


def test_equal_timestamps_across_pages_are_all_delivered_and_the_next_scan_rereads_the_last_second(world):
    refs = world.add_issues(250, same_updated_at=True)
    adapter = world.adapter()
    issues, tokens = scan(world, adapter, page_size=100)
    assert sorted(i.external_ref for i in issues) == sorted(refs) and len(issues) == 250
    since = GitHubCursor.decode(tokens[-1]).since
    assert since == issues[0].external_updated_at - timedelta(seconds=1)
    again, _ = scan(world, adapter, page_size=100, cursor=tokens[-1])
    assert {i.external_ref for i in again} == set(refs)  # the boundary second is read again, nothing is lost


def test_pull_requests_are_excluded_while_the_cursor_moves_past_them(world):
    world.add_issues(1)
    for _ in range(3):
        world.add_excluded_item()
    world.state.clock.advance(5)
    page = fetch(world.adapter())
    assert [i.title for i in page.issues] == ["Issue 0"] and page.excluded == 3
    newest_pull = max(i.updated_at for i in world.state.repositories[REPOSITORY_ID].issues.values()
                      if i.is_pull_request)
    assert GitHubCursor.decode(page.next_cursor).since == newest_pull.replace(microsecond=0) - timedelta(seconds=1)


def test_identity_survives_a_rename_and_redirects_are_refused_never_followed(world):
    (ref,) = world.add_issues(1)
    adapter = world.adapter()
    before = fetch(adapter).issues[0]
    world.state.rename(REPOSITORY_ID, "acme-renamed", "platform-next")
    world.clear_requests()
    refused = fetch(adapter)
    assert isinstance(refused, FetchFailure) and (refused.retry_class, refused.reason) == ("terminal", "ordinary_4xx")
    assert "HTTP 301" in refused.detail and len(world.transport.requests) == 1  # not followed
    command = close_command(ref)
    closing = adapter.comment_and_close(command, _attempt())
    assert isinstance(closing, CloseFailure) and "HTTP 307" in closing.detail and world.comments(ref) == []
    adapter._token.drop()  # the next mint learns the repository's current name from its id
    after = fetch(adapter).issues[0]
    assert after.external_ref == before.external_ref == ref
    assert "acme-renamed/platform-next" in after.display_url


def test_a_reused_name_is_never_read_under_this_repositorys_identity(world):
    world.add_issues(1)
    adapter = world.adapter()
    world.state.rename(REPOSITORY_ID, "acme", "platform-archived")
    impostor = world.state.add_repository(999, "acme", f"platform-{REPOSITORY_ID}")
    world.state.add_issue(impostor.id, title="not ours")
    result = fetch(adapter)
    assert isinstance(result, FetchFailure) and "HTTP 404" in result.detail  # the token covers only our id


@pytest.mark.parametrize("damage, reason, words", [
    ("revoke_key", "authentication", "A JSON web token could not be decoded"),
    ("uninstall", "authorization", "HTTP 404"),
    ("suspend", "authorization", "suspended"),
    ("drop_repository", "authorization", "not accessible to the parent installation"),
])
def test_a_revoked_key_or_installation_fails_closed_with_one_line(world, damage, reason, words):
    installation = world.state.installations[INSTALLATION_ID]
    if damage == "revoke_key":
        world.state.apps[APP_ID].public_keys = [new_key_pair()[1]]
    elif damage == "uninstall":
        del world.state.installations[INSTALLATION_ID]
    elif damage == "suspend":
        installation.suspended = True
    else:
        installation.repository_ids = []
    with pytest.raises(GitHubCredentialsRefused) as refused:
        world.adapter()
    line = str(refused.value)
    assert words in line and "\n" not in line and f"app {APP_ID}" in line and world.private_key not in line
    registration = world.registration()
    connector = GitHubConnector(registration.provider, SecretStr(world.private_key),
                                ComposeContext(transport=world.transport))
    problem = connector.mint(Deadline(_attempt()))
    assert (problem.retry_class, problem.reason) == ("terminal", reason)


def test_a_revoked_installation_token_is_dropped_and_the_next_call_fails_closed_at_the_mint(world):
    world.add_issues(1)
    adapter = world.adapter()
    world.state.revoke_tokens(INSTALLATION_ID)
    world.state.installations[INSTALLATION_ID].suspended = True
    first = fetch(adapter)
    assert isinstance(first, FetchFailure) and first.reason == "authentication" and "Bad credentials" in first.detail
    second = fetch(adapter)
    assert isinstance(second, FetchFailure) and (second.retry_class, second.reason) == ("terminal", "authorization")
    assert "suspended" in second.detail and ops(world)[-1] == "create_token"


def test_the_token_is_refreshed_before_it_expires_and_work_goes_on_across_the_old_ones_expiry(world):
    world.add_issues(2)
    adapter = on_sim_clock(world)
    first_token = next(iter(world.state.tokens))
    world.advance(56 * 60)  # inside the five-minute refresh margin of the hour
    page = fetch(adapter)
    assert isinstance(page, ExternalIssuePage) and ops(world)[-2:] == ["create_token", "list"]
    assert len(world.state.tokens) == 2
    world.advance(10 * 60)  # the first token has expired; the second is used
    again = fetch(adapter, page.next_cursor)
    assert isinstance(again, ExternalIssuePage) and ops(world)[-1] == "list"
    assert world.transport.requests[-1].headers["Authorization"] != f"Bearer {first_token}"
    assert world.state.tokens[first_token].expires_at <= world.state.clock.now()


def test_a_primary_limit_waits_for_the_reset_and_sends_nothing_meanwhile(world, pool):
    world.add_issues(5)
    world.state.primary = PrimaryLimit(limit=2, window_s=600)
    adapter = on_sim_clock(world, gates_of(pool))
    first = fetch(adapter, page_size=2)
    second = fetch(adapter, first.next_cursor, page_size=2)  # spends the last request: remaining 0
    assert isinstance(second, ExternalIssuePage)
    held = fetch(adapter, second.next_cursor, page_size=2)
    assert isinstance(held, FetchFailure) and (held.retry_class, held.reason) == ("retryable", "throttled")
    assert 0 < held.retry_after_seconds <= 601 and "nothing was sent" in held.detail
    assert world.state.limited_calls == 0 and ops(world).count("list") == 2
    pass_the_held_time(world, pool, held.retry_after_seconds)
    assert isinstance(fetch(adapter, second.next_cursor, page_size=2), ExternalIssuePage)
    assert world.state.limited_calls == 0


def test_a_primary_limit_answer_is_throttling_never_authorization(world):
    world.add_issues(1)
    world.state.primary = PrimaryLimit(limit=0, window_s=3600)
    result = fetch(world.adapter())
    assert isinstance(result, FetchFailure) and (result.retry_class, result.reason) == ("retryable", "throttled")
    until_reset = 3600 - world.state.clock.now().timestamp() % 3600  # the world's clock is the wall time
    assert result.retry_after_seconds == pytest.approx(until_reset + RESET_SLACK_S, abs=2)  # not a 60 s default
    assert "API rate limit exceeded" in result.detail


@pytest.mark.parametrize("retry_after, minimum", [(30, 30), (None, 60)])
def test_a_secondary_limit_waits_as_asked_or_at_least_a_minute(world, retry_after, minimum):
    (ref,) = world.add_issues(1)
    world.state.secondary = SecondaryLimit(creations=0, retry_after=retry_after)
    result, log = executor().close(world.adapter(), close_command(ref))
    assert isinstance(result, CloseFailure) and (result.reason, result.write_disposition) == ("throttled",
                                                                                              "not_written")
    assert result.retry_after_seconds >= minimum and log.attempts == 1 and world.comments(ref) == []


def test_a_permission_403_is_terminal_authorization(world):
    (ref,) = world.add_issues(1)
    world.state.installations[INSTALLATION_ID].permissions = {"issues": "read", "metadata": "read"}
    with pytest.raises(GitHubCredentialsRefused, match="not granted"):
        world.adapter()  # the token asked for issues: write is refused at the mint
    world.state.installations[INSTALLATION_ID].permissions = {"issues": "write", "metadata": "read"}
    adapter = world.adapter()
    for token in world.state.tokens.values():
        token.permissions = {"issues": "read", "metadata": "read"}
    result, log = executor().close(adapter, close_command(ref))
    assert isinstance(result, CloseFailure) and (result.retry_class, result.reason) == ("terminal", "authorization")
    assert "Resource not accessible by integration" in result.detail and log.attempts == 1


def test_an_unchanged_poll_ends_with_one_conditional_request_answered_304(world):
    world.add_issues(3)
    adapter = world.adapter()
    _, tokens = scan(world, adapter)
    _, tokens = scan(world, adapter, cursor=tokens[-1])  # reads the overlap second again
    world.clear_requests()
    page = fetch(adapter, tokens[-1])
    assert isinstance(page, ExternalIssuePage) and page.exhausted and page.issues == ()
    assert world.transport.requests[0].headers.get("If-None-Match", "").startswith('W/"')
    assert len(world.transport.requests) == 1 and page.next_cursor != tokens[-1]
    world.update_issue(f"github:{REPOSITORY_ID}:2", title="changed")
    changed = fetch(adapter, page.next_cursor)
    assert "changed" in [i.title for i in changed.issues]  # with the rest of the overlap second


def test_a_tie_run_longer_than_a_page_never_hides_a_later_change_behind_a_304(world):
    refs = world.add_issues(45, same_updated_at=True)  # a bulk edit: page 1 is all one second
    adapter = world.adapter()
    _, tokens = scan(world, adapter, page_size=10)
    world.advance(5)
    _, tokens = scan(world, adapter, page_size=10, cursor=tokens[-1])  # the next scan asks the same question
    world.advance(5)
    world.update_issue(refs[40], title="changed on page 5")
    (new,) = world.add_issues(1, title="Brand new")
    for _ in range(2):  # page 1 is unchanged; the change is on later pages
        issues, tokens = scan(world, adapter, page_size=10, cursor=tokens[-1])
        titles = {i.external_ref: i.title for i in issues}
        if titles.get(refs[40]) == "changed on page 5" and new in titles:
            break
    else:
        raise AssertionError("the change behind an unchanged first page was never delivered")


def test_only_a_single_page_scan_keeps_its_etag_for_the_next_scan(world):
    world.add_issues(3, same_updated_at=True)
    adapter = world.adapter()
    _, tokens = scan(world, adapter, page_size=2)  # two pages
    assert all(GitHubCursor.decode(t).etag is None for t in tokens[1:])
    world.advance(5)
    _, tokens = scan(world, adapter, page_size=10, cursor=tokens[-1])  # one page: the whole scan
    assert GitHubCursor.decode(tokens[-1]).etag is not None


def test_a_refused_next_link_restarts_the_scan_without_missing_anything(world):
    refs = world.add_issues(6)
    adapter = world.adapter()
    first = fetch(adapter, page_size=2)
    world.state.faults.push("list_issues", Fault(status=422, body={"message": "Validation Failed"}))
    restarted = fetch(adapter, first.next_cursor, page_size=2)
    assert isinstance(restarted, ExternalIssuePage) and not restarted.exhausted and restarted.issues == ()
    rest, _ = scan(world, adapter, page_size=2, cursor=restarted.next_cursor)
    assert {i.external_ref for i in first.issues + tuple(rest)} == set(refs)


def test_a_next_link_outside_the_api_is_refused(world):
    world.add_issues(3)
    world.state.faults.push("list_issues", Fault(status=200, body=[], headers={
        "Link": '<https://evil.example.com/repositories/1/issues?after=x>; rel="next"'}))
    result = fetch(world.adapter())
    assert isinstance(result, FetchFailure) and result.reason == "invalid_payload" and "outside" in result.detail


def test_payloads_are_validated_strictly(world):
    world.add_issues(1)
    adapter = world.adapter()
    for item, words in (({"number": 1, "updated_at": "2026-01-01T00:00:00Z", "id": 5, "title": "t", "body": None,
                          "state": "merged", "labels": [], "user": None, "html_url": "https://x"}, "state"),
                        ({"number": 0, "updated_at": "2026-01-01T00:00:00Z"}, "number"),
                        ({"number": 2, "updated_at": "yesterday"}, "updated_at")):
        world.state.faults.push("list_issues", Fault(status=200, body=[item]))
        result = fetch(adapter)
        assert isinstance(result, FetchFailure) and result.reason == "invalid_payload" and words in result.detail
    world.state.update_issue(REPOSITORY_ID, 1, body="x" * 1_048_577)
    result = fetch(adapter)
    assert isinstance(result, FetchFailure) and result.reason == "invalid_payload" and "description" in result.detail


def listed(world, number: int = 1) -> dict:
    """Issue `number` as the simulator lists it."""
    return issue_payload(world.state.issue(REPOSITORY_ID, number), world.state.repositories[REPOSITORY_ID], API_URL)


@pytest.mark.parametrize("field, value", [
    ("number", True), ("number", 1.0), ("id", "1"), ("user", {"id": "8", "login": "u"}),  # no JSON integers
    ("updated_at", 1793523600), ("updated_at", "1793523600"),  # epoch seconds
    ("updated_at", "2026-11-01T09:00:00"),  # no zone
    ("updated_at", "0001-01-01T00:00:00+00:01"), ("updated_at", "0001-01-01T00:00:00Z"),  # before any cursor time
])
def test_a_listed_number_is_a_json_integer_and_a_time_zoned_iso_text(world, field, value):
    # found by tests/connectors/github/test_fuzz.py: `"number": true` was issue 1
    world.add_issues(2)
    body = [listed(world, 1), {**listed(world, 2), field: value}]
    world.state.faults.push("list_issues", Fault(status=200, body=body))
    result = fetch(world.adapter())
    assert isinstance(result, FetchFailure) and result.reason == "invalid_payload" and field in result.detail


def test_a_pull_request_with_a_zone_less_time_is_invalid_payload_not_a_comparison_error(world):
    world.add_issues(1)
    world.add_excluded_item()
    pull = {**listed(world, 2), "updated_at": "2026-11-01T09:00:00"}
    world.state.faults.push("list_issues", Fault(status=200, body=[listed(world, 1), pull]))
    result = fetch(world.adapter())
    assert isinstance(result, FetchFailure) and result.reason == "invalid_payload" and "updated_at" in result.detail


def test_a_deleted_author_maps_to_the_ghost_user(world):
    world.add_issues(1)
    world.state.issue(REPOSITORY_ID, 1).user = None
    (issue,) = fetch(world.adapter()).issues
    assert (issue.reporter_ref, issue.reporter_display_name) == ("github-user:ghost", "ghost")


def test_the_cursor_round_trips_and_refuses_garbage():
    cursor = GitHubCursor(seq=4, etag='W/"abc"', next="/repositories/1/issues?after=abc&page=2")
    assert GitHubCursor.decode(cursor.encode()) == cursor
    for bad in ("gl1;n=1", "gh1;n=x;since=-;from=-;hwm=-;etag=-;next=-",
                "gh1;n=1;since=yesterday;from=-;hwm=-;etag=-;next=-",
                "gh1;n=1;since=-;from=-;hwm=-;etag=-;next=https://evil.example.com/x"):
        with pytest.raises(ValueError):
            GitHubCursor.decode(bad)


_NEXT = f'<{API_URL}/repositories/{REPOSITORY_ID}/issues?after=x&page=2>; rel="next"'


@pytest.mark.parametrize("headers", [
    {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "\u00b2".encode("latin-1")},  # isdigit(), yet no int
    {"Date": "Fri, 31 Dec 9999 23:59:59 -0100"},  # the year 10000 in UTC
    {"ETag": "\x7f"}, {"ETag": 'W/"a;b"'},  # no ETag a cursor field can carry
])
def test_garbage_response_headers_leave_a_typed_page_whose_cursor_reads_back(world, headers):
    # found by tests/connectors/github/test_fuzz.py: each of these escaped as an exception or an unreadable cursor
    world.state.faults.push("list_issues", Fault(status=200, body=[], headers=headers))
    page = fetch(world.adapter(), _SAME_SINCE)
    assert isinstance(page, ExternalIssuePage) and GitHubCursor.decode(page.next_cursor).etag is None


# A one-page scan whose next scan asks the same question (its `since` stays): its ETag is kept.
_SAME_SINCE = GitHubCursor(seq=1, since=datetime(2099, 1, 1, tzinfo=UTC)).encode()


def test_an_etag_a_cursor_can_carry_is_kept_for_the_next_request(world):
    world.state.faults.push("list_issues", Fault(status=200, body=[], headers={"ETag": 'W/"0a1b"'}))
    assert GitHubCursor.decode(fetch(world.adapter(), _SAME_SINCE).next_cursor).etag == 'W/"0a1b"'


def test_a_permission_403_dated_with_a_budget_left_holds_nothing(world, pool):
    (ref,) = world.add_issues(1)
    reset = str(int(world.state.clock.now().timestamp()) + 3600)
    world.state.faults.push("create_comment", Fault(status=403, body={"message": "Resource not accessible by "
                                                                                 "integration"},
                                                    headers={"x-ratelimit-remaining": "4999",
                                                             "x-ratelimit-reset": reset}))
    gates = gates_of(pool)
    result, _ = executor().close(on_sim_clock(world, gates), close_command(ref))
    assert isinstance(result, CloseFailure) and (result.retry_class, result.reason) == ("terminal", "authorization")
    with pool.connection() as conn:
        assert conn.execute("SELECT count(*) FROM provider_gates WHERE held_until > now()").fetchone() == (0,)


def test_a_rate_limit_reset_beyond_any_clock_is_a_days_wait(world, pool):
    world.state.faults.push("list_issues", Fault(status=200, body=[], headers={
        "x-ratelimit-remaining": "0", "x-ratelimit-reset": "9" * 400}))
    adapter = on_sim_clock(world, gates_of(pool))
    page = fetch(adapter)
    held = fetch(adapter, page.next_cursor)
    assert isinstance(held, FetchFailure) and held.reason == "throttled" and "nothing was sent" in held.detail
    assert MAX_RESET_WAIT_S - 5 <= held.retry_after_seconds <= MAX_RESET_WAIT_S


def test_a_next_link_that_is_no_url_is_invalid_payload(world):
    world.state.faults.push("list_issues", Fault(status=200, body=[], headers={"Link": '<\x7f>; rel="next"'}))
    result = fetch(world.adapter())
    assert isinstance(result, FetchFailure) and result.reason == "invalid_payload" and "not a URL" in result.detail


@pytest.mark.parametrize("hwm", ["0001-01-01000+0001", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59-00:01"])
def test_a_cursor_time_outside_what_a_cursor_holds_is_a_contract_violation(world, hwm):
    # found by tests/connectors/github/test_fuzz.py (the first token): re-encoding it raised OverflowError
    result = fetch(world.adapter(), f"gh1;n=0;since=-;from=-;hwm={hwm};etag=0;next=/")
    assert isinstance(result, FetchFailure) and result.reason == "contract_violation"
    assert "out of range" in result.detail


def test_a_listed_item_is_validated_once_an_issue_as_an_issue_and_a_pull_request_as_an_item(world, monkeypatch):
    world.add_issues(3)
    world.add_excluded_item()
    builds = collections.Counter()
    validate = BaseModel.model_validate.__func__

    def counted(cls, obj, *args, **kwargs):
        builds[cls.__name__] += 1
        return validate(cls, obj, *args, **kwargs)

    monkeypatch.setattr(adapter_module._Item, "model_validate", classmethod(counted))  # _Issue inherits it
    page = fetch(world.adapter())
    assert isinstance(page, ExternalIssuePage) and len(page.issues) == 3 and page.excluded == 1
    assert builds == {"_Issue": 3, "_Item": 1}


def test_a_listed_issue_its_model_refuses_is_named_by_its_number_and_one_without_a_number_by_the_listing(world):
    world.add_issues(2)
    adapter = world.adapter()
    for item, detail in (({**listed(world, 2), "title": None}, "issue 2: title"),
                         ({**listed(world, 2), "number": None}, "listing issues: number")):
        world.state.faults.push("list_issues", Fault(status=200, body=[listed(world, 1), item]))
        result = fetch(adapter)
        assert isinstance(result, FetchFailure) and result.reason == "invalid_payload"
        assert result.detail.startswith(detail), result.detail
