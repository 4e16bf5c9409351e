"""Jira specifics beyond the shared suite: the request shape, minute-granular JQL bounds in the
account's time zone, ties and mid-scan updates inside one minute, late-indexed changes, page
token expiry, identity, scopes and permissions, rate limits, strict payloads, and close-back
through each work type's own transitions."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit
from zoneinfo import ZoneInfo

import httpx
import pytest

from nexus_pipelines.connectors.core.registration import RegistrationError
from nexus_pipelines.connectors.core.values import (
    AmbiguousWrite,
    CloseFailure,
    ConnectorReceipt,
    ExternalIssuePage,
    FetchFailure,
    FetchIssuePage,
)
from nexus_pipelines.connectors.jira.account import JiraAccountRefused
from nexus_pipelines.connectors.jira.adf import to_adf, to_text
from nexus_pipelines.connectors.jira.cursor import JiraCursor, jql_minute
from nexus_pipelines.connectors.provider_http import RECONCILE_READS
from nexus_pipelines.local.simulators.http import Fault
from nexus_pipelines.local.simulators.jira import (
    BROWSE,
    BUG,
    EPIC,
    READ_SCOPE,
    REVIEW_SUBTASK,
    SUBTASK,
    USER_SCOPE,
    WRITE_SCOPE,
    RateLimit,
)
from tests.connectors.conformance.suite import _attempt, close_command, executor, scan
from nexus_pipelines.local.worlds.jira import API_URL, BOT, EMAIL, PROJECT_ID, TIME_ZONE, TOKEN_ENV, JiraWorld


@pytest.fixture
def world():
    return JiraWorld()


def fetch(world, cursor=None, page_size=100, **provider):
    adapter = world.adapter(world.registration(**provider)) if provider else world.adapter()
    return adapter.fetch_page(FetchIssuePage(cursor=cursor, page_size=page_size), _attempt())


def query_of(request):
    return {k: v[-1] for k, v in parse_qs(urlsplit(str(request.url)).query).items()}


def searches(world):
    return [query_of(r) for r in world.transport.requests if r.url.path.endswith("/search/jql")]


# -- the listing ---------------------------------------------------------------------------


def test_the_listing_is_the_enhanced_search_with_basic_auth_and_only_the_mapped_fields(world):
    world.add_issues(3)
    first = fetch(world, page_size=2)
    request = world.transport.requests[0]
    assert request.url.path == f"/ex/jira/{world.cloud_id}/rest/api/3/search/jql" and request.method == "GET"
    assert query_of(request) == {"jql": f"project = {PROJECT_ID} ORDER BY updated ASC, id ASC", "maxResults": "2",
                                 "fields": "summary,description,labels,reporter,status,updated,project,issuetype"}
    scheme, _, encoded = request.headers["Authorization"].partition(" ")
    assert (scheme, base64.b64decode(encoded).decode()) == ("Basic", f"{EMAIL}:{world.environ[TOKEN_ENV]}")
    second = fetch(world, first.next_cursor, page_size=2)
    follow = query_of(world.transport.requests[1])
    assert follow["jql"] == query_of(request)["jql"] and follow["nextPageToken"]  # the same query, Jira's token
    assert second.exhausted and not first.exhausted


def test_the_next_scan_is_bounded_by_the_minute_in_the_accounts_profile_time_zone(world):
    world.add_issues(2)
    started = world.state.clock.now()
    _, tokens = scan(world, world.adapter())
    since = JiraCursor.decode(tokens[-1]).since
    assert since is not None and since <= started - timedelta(minutes=1)
    fetch(world, tokens[-1])
    local = since.astimezone(ZoneInfo("Australia/Sydney")).strftime("%Y-%m-%d %H:%M")
    assert searches(world)[-1]["jql"] == (f'project = {PROJECT_ID} AND updated >= "{local}" '
                                          "ORDER BY updated ASC, id ASC")


def test_a_jql_minute_never_means_a_later_instant_across_a_daylight_saving_change():
    zone = ZoneInfo("America/New_York")  # 2026-11-01 01:00-01:59 happens twice
    first_pass = datetime(2026, 11, 1, 5, 30, tzinfo=UTC)  # 01:30 EDT
    assert jql_minute(first_pass, zone) == "2026-11-01 00:59"  # "01:30" could mean 06:30Z
    second_pass = datetime(2026, 11, 1, 6, 30, tzinfo=UTC)  # 01:30 EST
    assert jql_minute(second_pass, zone) == "2026-11-01 01:30"
    assert jql_minute(datetime(2026, 11, 1, 9, 17, 59, tzinfo=UTC), ZoneInfo("Australia/Sydney")) == "2026-11-01 20:17"


def test_the_earliest_meaning_of_a_bound_is_the_earliest_instant_its_jql_literal_means():
    from nexus_pipelines.connectors.jira.cursor import earliest_meaning

    for name in ("America/New_York", "Australia/Sydney", "UTC", "Asia/Kolkata"):
        zone = ZoneInfo(name)
        for minutes in range(0, 48 * 60, 7):  # two days around New York's fall-back night, every 7 minutes
            bound = datetime(2026, 10, 31, 12, 0, 29, 500_000, tzinfo=UTC) + timedelta(minutes=minutes)
            literal = datetime.strptime(jql_minute(bound, zone), "%Y-%m-%d %H:%M")
            meanings = [literal.replace(tzinfo=zone, fold=fold).astimezone(UTC) for fold in (0, 1)]
            assert earliest_meaning(bound, zone) == min(meanings) and max(meanings) <= bound


def test_a_page_of_issues_reads_no_jql_literal_back_for_the_scan_rules(world, monkeypatch):
    """The scan asks the earliest meaning of every issue's update time: from the wall minute,
    not from its text parsed again."""
    import _strptime

    parsed = []
    real = _strptime._strptime_datetime
    monkeypatch.setattr(_strptime, "_strptime_datetime", lambda *args: parsed.append(args) or real(*args))
    world.add_issues(30)
    page = fetch(world, page_size=30)
    assert isinstance(page, ExternalIssuePage) and len(page.issues) == 30
    assert parsed == []


def test_many_issues_inside_one_minute_cross_page_boundaries_without_a_gap_or_a_repeat(world):
    start = world.state.clock.now().replace(second=0, microsecond=0)
    ids = [world.state.add_issue(world.cloud_id, PROJECT_ID, summary=f"tie {n}",
                                 updated_at=start + timedelta(milliseconds=(n // 4) * 250)).id for n in range(97)]
    world.advance(61)
    issues, tokens = scan(world, world.adapter(), page_size=10)
    assert [world.issue_id(i.external_ref) for i in issues] == ids  # (updated, id) order, each once
    assert len(tokens) - 1 == 10  # ceil(97 / 10) pages, no extra
    again, _ = scan(world, world.adapter(), page_size=10, cursor=tokens[-1])
    assert len({i.external_ref for i in again}) == len(again) == 97  # the minute is overlap: re-read once, deduped


def test_an_issue_updated_mid_scan_inside_the_same_minute_moves_and_nothing_shifts(world):
    start = world.state.clock.now().replace(second=0, microsecond=0)
    ids = [world.state.add_issue(world.cloud_id, PROJECT_ID, summary=f"i{n}",
                                 updated_at=start + timedelta(milliseconds=n)).id for n in range(30)]
    world.state.clock.advance(1)
    adapter = world.adapter()
    first = adapter.fetch_page(FetchIssuePage(cursor=None, page_size=10), _attempt())
    world.state.update_issue(world.cloud_id, ids[3], summary="read, then edited")  # already read
    world.state.update_issue(world.cloud_id, ids[25], summary="not read yet, edited")  # still ahead
    rest, _ = scan(world, adapter, page_size=10, cursor=first.next_cursor)
    seen = [world.issue_id(i.external_ref) for i in (*first.issues, *rest)]
    assert set(seen) == set(ids) and seen.count(ids[25]) == 1 and seen.count(ids[3]) == 2
    assert [i.title for i in rest if world.issue_id(i.external_ref) == ids[3]] == ["read, then edited"]


def test_an_issue_updated_mid_scan_shifts_nothing_past_the_cursor_with_offset_page_tokens(world):
    world.state.offset_page_tokens = True
    start = world.state.clock.now() - timedelta(hours=2)
    ids = [world.state.add_issue(world.cloud_id, PROJECT_ID, summary=f"i{n}",
                                 updated_at=start + timedelta(minutes=3 * n)).id for n in range(30)]
    adapter = world.adapter()
    first = adapter.fetch_page(FetchIssuePage(cursor=None, page_size=10), _attempt())
    world.advance(1)
    world.state.update_issue(world.cloud_id, ids[3], summary="read, then edited")  # the rest shift back one
    rest, tokens = scan(world, adapter, page_size=10, cursor=first.next_cursor)
    world.advance(120)
    later, again = scan(world, adapter, page_size=10, cursor=tokens[-1])
    seen = {world.issue_id(i.external_ref) for i in (*first.issues, *rest, *later)}
    assert seen == set(ids)  # the one the shift skipped comes with the scan from the bound
    quiet, _ = scan(world, adapter, page_size=10, cursor=again[-1])
    assert len(quiet) <= 1  # no change during that scan: the cursor moved on


def test_a_change_searchable_only_after_the_scan_is_read_by_the_next_scan(world):
    world.add_issues(3)
    world.state.index_lag = timedelta(seconds=20)
    late = world.state.add_issue(world.cloud_id, PROJECT_ID, summary="indexed late")
    world.advance(5)
    first, tokens = scan(world, world.adapter())
    assert world.ref(late.id) not in {i.external_ref for i in first}  # not searchable yet
    world.advance(60)
    second, _ = scan(world, world.adapter(), cursor=tokens[-1])
    assert world.ref(late.id) in {i.external_ref for i in second}


def test_an_expired_page_token_restarts_the_scan_from_its_own_bound(world):
    world.add_issues(6)
    _, tokens = scan(world, world.adapter(), page_size=2)
    more = world.add_issues(4)
    first = fetch(world, tokens[-1], page_size=2)
    world.advance(7 * 24 * 3600)  # the token outlives Jira's 7 days
    restarted = fetch(world, first.next_cursor, page_size=2)
    assert isinstance(restarted, ExternalIssuePage) and restarted.issues == () and not restarted.exhausted
    cursor = JiraCursor.decode(restarted.next_cursor)
    assert cursor.next is None and cursor.since == JiraCursor.decode(tokens[-1]).since
    rest, _ = scan(world, world.adapter(), page_size=2, cursor=restarted.next_cursor)
    assert set(more) <= {i.external_ref for i in (*first.issues, *rest)}  # nothing the expired scan held is lost


def test_a_refused_page_token_that_has_not_expired_is_a_terminal_failure(world):
    world.add_issues(3)
    first = fetch(world, page_size=1)
    assert JiraCursor.decode(first.next_cursor).next is not None
    forged = JiraCursor(seq=5, issued_at=world.state.clock.now(), next="eyJub3QiOiAiamlyYSJ9")
    result = fetch(world, forged.encode())
    assert isinstance(result, FetchFailure) and (result.retry_class, result.reason) == ("terminal", "ordinary_4xx")


def test_a_jql_time_zone_other_than_the_accounts_profile_zone_is_refused_at_composition_naming_both(world):
    world.add_issues(1)
    with pytest.raises(JiraAccountRefused) as refused:
        world.adapter(world.registration(jql_time_zone="Europe/Berlin"))  # east of nothing: Sydney is the profile's
    line = str(refused.value)
    assert "Europe/Berlin" in line and TIME_ZONE in line and "\n" not in line and "register again" in line
    assert world.state.calls["get_myself"] == 1 and world.state.calls["search_issues"] == 0  # nothing was searched


def test_a_profile_zone_changed_later_is_refused_by_the_next_composition(world):
    world.add_issues(1)
    assert isinstance(fetch(world), ExternalIssuePage)
    world.state.accounts[BOT].time_zone = "America/Los_Angeles"  # an administrator changes the profile
    with pytest.raises(JiraAccountRefused, match="profile time zone is America/Los_Angeles"):
        world.adapter()


def test_the_account_zone_check_needs_read_jira_user_and_says_so(world):
    world.state.tokens[world.token].scopes = (READ_SCOPE, WRITE_SCOPE)
    with pytest.raises(JiraAccountRefused, match="lacks read:jira-user"):
        world.adapter()


def test_a_profile_zone_changed_mid_run_is_caught_when_jira_answers_before_the_bound(world):
    old = world.state.add_issue(world.cloud_id, PROJECT_ID, summary="two hours earlier",
                                updated_at=world.state.clock.now() - timedelta(hours=2))
    world.add_issues(1)
    adapter = world.adapter()
    _, tokens = scan(world, adapter)
    # three hours east of the zone the run composed in: the bound now means an earlier instant
    # (a zone moved west asks from the future instead, which the next run's composition refuses)
    world.state.accounts[BOT].time_zone = "Pacific/Kiritimati"
    result = adapter.fetch_page(FetchIssuePage(cursor=tokens[-1], page_size=100), _attempt())
    assert isinstance(result, FetchFailure) and result.reason == "invalid_payload"
    assert "jql_time_zone" in result.detail and str(old.id) in result.detail


# -- mapping and identity ------------------------------------------------------------------


def test_identity_is_the_site_and_issue_id_and_the_key_is_only_the_link(world):
    (ref,) = world.add_issues(1)
    (before,), _ = scan(world, world.adapter())
    world.state.rename_project_key(world.cloud_id, PROJECT_ID, "RENAMED")
    world.state.update_issue(world.cloud_id, world.issue_id(ref), summary="after the rename")
    world.advance(1)
    (after,), _ = scan(world, world.adapter())
    assert before.external_ref == after.external_ref == f"jira:{world.cloud_id}:{world.issue_id(ref)}"
    assert before.display_url.endswith(f"/browse/P{PROJECT_ID}-1") and after.display_url.endswith("/browse/RENAMED-1")


def test_descriptions_labels_reporter_and_done_statuses_map_with_jiras_meaning(world):
    issue = world.state.add_issue(world.cloud_id, PROJECT_ID, summary="mapped", description="line one\nline two",
                                  labels=["backend", "p1"], status=10003)  # Won't Do: a done category
    world.advance(1)
    (mapped,), _ = scan(world, world.adapter())
    assert mapped.description == "line one\n\nline two" and mapped.source_labels == ("backend", "p1")
    assert mapped.reporter_ref == "jira-user:5b10a2844c20165700ede21g" and mapped.reporter_display_name
    assert mapped.external_state == "closed" and mapped.title == "mapped" and str(issue.id) in mapped.external_ref


def test_every_sub_task_type_of_the_site_and_of_a_team_managed_project_is_skipped_by_its_own_payload(world):
    world.state.add_issue_type(10100, "Subtask", hierarchy_level=-1, project_id=PROJECT_ID)  # team-managed
    world.state.add_issue_type(10101, "Story", project_id=PROJECT_ID)
    kept = [world.state.add_issue(world.cloud_id, PROJECT_ID, summary=t, issuetype=k)
            for t, k in (("a task", 10001), ("a story", 10101), ("an epic", EPIC))]
    for kind in (SUBTASK, REVIEW_SUBTASK, 10100):
        world.state.add_issue(world.cloud_id, PROJECT_ID, summary=f"sub-task {kind}", issuetype=kind)
    world.advance(1)
    result = fetch(world)
    assert isinstance(result, ExternalIssuePage) and result.excluded == 3
    assert sorted(i.title for i in result.issues) == sorted(i.summary for i in kept)


def test_a_registration_that_still_lists_excluded_issue_type_ids_is_refused_in_one_line(world):
    with pytest.raises(RegistrationError) as refused:
        world.registration(excluded_issue_type_ids=[10003])
    assert "excluded_issue_type_ids is no longer read" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("change, why", [
    ({"fields": {"issuetype": {"id": "10003"}}}, "subtask"),
    ({"fields": {"project": {"id": "99999"}}}, "belongs to project 99999"),
    ({"fields": {"status": {"id": "1", "statusCategory": {"key": "in-flight"}}}}, "status category"),
    ({"fields": {"updated": "2026-11-01 09:00"}}, "updated"),
    ({"key": "not a key"}, "key"),
    ({"fields": {"description": {"type": "doc", "content": [{"type": "text"}]}}}, "text"),
])
def test_a_payload_that_breaks_jiras_schema_is_refused_whole(world, change, why):
    valid = {"id": "10001", "key": "PLAT-1", "fields": {
        "summary": "s", "description": None, "labels": [], "reporter": None, "updated": "2026-11-01T09:00:00.000+0000",
        "status": {"id": "10000", "statusCategory": {"key": "new"}}, "project": {"id": str(PROJECT_ID)},
        "issuetype": {"id": "10001", "subtask": False}}}
    broken = {**valid, **{k: v for k, v in change.items() if k != "fields"},
              "fields": {**valid["fields"], **change.get("fields", {})}}
    world.state.faults.push("search_issues", Fault(status=200, body={"issues": [valid, broken], "isLast": True}))
    result = fetch(world)
    assert isinstance(result, FetchFailure) and result.reason == "invalid_payload" and why in result.detail


def test_an_is_last_that_contradicts_the_page_token_is_refused(world):
    world.state.faults.push("search_issues", Fault(status=200, body={"issues": [], "isLast": False}))
    result = fetch(world)
    assert isinstance(result, FetchFailure) and result.reason == "invalid_payload" and "isLast" in result.detail


# -- credentials, permissions, limits -------------------------------------------------------


def test_a_token_without_the_write_scope_is_an_authorization_failure_that_writes_nothing(world):
    (ref,) = world.add_issues(1)
    world.state.tokens[world.token].scopes = (READ_SCOPE, USER_SCOPE)
    result, log = executor().close(world.adapter(), close_command(ref))
    assert isinstance(result, CloseFailure) and (result.reason, result.retry_class) == ("authorization", "terminal")
    assert "scope" in result.detail and world.comments(ref) == [] and log.attempts == 1


@pytest.mark.parametrize("spoil", ["revoke", "expire", "other_email"])
def test_a_revoked_or_expired_token_or_another_accounts_email_is_an_authentication_failure(world, spoil):
    world.add_issues(1)
    if spoil == "other_email":
        with pytest.raises(JiraAccountRefused, match="HTTP 401: the API token is invalid"):
            world.adapter(world.registration(email="someone.else@example.test"))  # refused at composition
        return
    adapter = world.adapter()
    if spoil == "revoke":
        world.state.revoke(world.token)
    else:
        world.state.tokens[world.token].expires_at = world.state.clock.now()
    result = adapter.fetch_page(FetchIssuePage(cursor=None, page_size=100), _attempt())
    assert isinstance(result, FetchFailure) and (result.reason, result.retry_class) == ("authentication", "terminal")


def test_a_project_the_account_cannot_browse_is_refused_as_a_query_error(world):
    world.add_issues(1)
    world.state.grant(world.cloud_id, PROJECT_ID, BOT, permissions=())
    result = fetch(world)
    assert isinstance(result, FetchFailure) and (result.reason, result.retry_class) == ("ordinary_4xx", "terminal")


def test_the_rate_limit_wait_comes_from_retry_after_or_from_the_reset_minute(world):
    world.add_issues(1)
    adapter = world.adapter()
    world.state.rate_limit = RateLimit(limit=1, window_s=60)
    assert isinstance(adapter.fetch_page(FetchIssuePage(cursor=None, page_size=100), _attempt()), ExternalIssuePage)
    limited = adapter.fetch_page(FetchIssuePage(cursor=None, page_size=100), _attempt())
    assert isinstance(limited, FetchFailure) and limited.reason == "throttled" and 0 < limited.retry_after_seconds <= 60
    world.state.rate_limit = None
    reset = (world.state.clock.now() + timedelta(minutes=3)).strftime("%Y-%m-%dT%H:%MZ")
    world.state.faults.push("search_issues", Fault(status=429, headers={"X-RateLimit-Reset": reset}))
    only_reset = fetch(world)
    assert only_reset.reason == "throttled" and 120 <= only_reset.retry_after_seconds <= 180


def test_a_503_with_retry_after_is_a_provider_fault_not_a_rate_limit(world):
    world.state.faults.push("search_issues", Fault(status=503, headers={"Retry-After": "30"}))
    result = fetch(world)
    assert isinstance(result, FetchFailure) and (result.reason, result.retry_after_seconds) == ("provider_5xx", None)


def test_a_redirect_is_refused_never_followed(world):
    world.state.faults.push("search_issues", Fault(status=302, headers={"Location": "https://elsewhere.test/x"}))
    result = fetch(world)
    assert isinstance(result, FetchFailure) and result.reason == "ordinary_4xx" and "HTTP 302" in result.detail
    assert len(world.transport.requests) == 1


# -- close-back -----------------------------------------------------------------------------


def close_calls(world):
    return [(r.method, r.url.path.rsplit("/", 1)[-1]) for r in world.transport.requests]


def test_each_close_lists_the_issues_transitions_and_uses_its_own_work_types_id(world):
    task = world.state.add_issue(world.cloud_id, PROJECT_ID, summary="a task")
    bug = world.state.add_issue(world.cloud_id, PROJECT_ID, summary="a bug", issuetype=BUG)
    for n, issue in enumerate((task, bug), start=1):
        world.clear_requests()
        result, _ = executor().close(world.adapter(), close_command(world.ref(issue.id), ticket=n))
        assert isinstance(result, ConnectorReceipt) and world.issue_state(world.ref(issue.id)) == "closed"
        assert close_calls(world) == [("GET", str(issue.id)), ("GET", "transitions"), ("POST", "comment"),
                                      ("POST", "transitions")]
    bodies = [json.loads(r.content) for r in world.transport.requests if r.method == "POST" and
              r.url.path.endswith("/transitions")]
    assert bodies == [{"transition": {"id": "51"}}]  # the bug's workflow: "Resolve", not the task's "Done" (31)


def test_an_issue_already_done_gets_its_comment_and_no_transition(world):
    (ref,) = world.add_issues(1)
    world.state.update_issue(world.cloud_id, world.issue_id(ref), status=10002)
    result, _ = executor().close(world.adapter(), close_command(ref))
    assert isinstance(result, ConnectorReceipt)
    assert close_calls(world) == [("GET", str(world.issue_id(ref))), ("POST", "comment")]


def test_a_replayed_close_of_a_done_issue_makes_no_second_transition_though_a_global_done_is_offered(world):
    (ref,) = world.add_issues(1)  # a task: its workflow has a global ("from any status") Done
    command = close_command(ref)
    assert isinstance(executor().close(world.adapter(), command)[0], ConnectorReceipt)
    basic = base64.b64encode(f"{EMAIL}:{world.token}".encode()).decode()
    with httpx.Client(transport=world.transport, base_url=API_URL) as client:
        offered = client.get(f"/ex/jira/{world.cloud_id}/rest/api/3/issue/{world.issue_id(ref)}/transitions",
                             headers={"Authorization": f"Basic {basic}"}).json()
    assert "10002" in [t["to"]["id"] for t in offered["transitions"]]  # Done is offered while Done, as in Jira
    for _ in range(5):
        replayed, _ = executor().close(world.adapter(), command.model_copy(update={"reconcile_first": True}))
        assert isinstance(replayed, ConnectorReceipt) and replayed.comment_ref.startswith("comment:")
    assert world.state.calls["do_transition"] == 1 and len(world.comments(ref)) == 1


def test_no_transition_to_the_done_status_writes_nothing(world):
    (ref,) = world.add_issues(1)
    world.state.grant(world.cloud_id, PROJECT_ID, BOT, permissions=(BROWSE, "ADD_COMMENTS"))  # no Transition issues
    result, log = executor().close(world.adapter(), close_command(ref))
    assert isinstance(result, CloseFailure) and (result.reason, result.write_disposition) == ("ordinary_4xx",
                                                                                              "not_written")
    assert "no transition to status 10002" in result.detail and world.comments(ref) == [] and log.attempts == 1


def test_the_comment_is_an_adf_document_that_reads_back_character_for_character(world):
    (ref,) = world.add_issues(1)
    command = close_command(ref)
    executor().close(world.adapter(), command)
    (posted,) = [json.loads(r.content)["body"] for r in world.transport.requests if r.url.path.endswith("/comment")]
    assert posted == to_adf(command.comment) and to_text(posted) == command.comment
    assert posted["content"][-1] == {"type": "paragraph", "content": [{"type": "text", "text": command.marker}]}


def test_the_marker_lookup_reads_every_comment_page_and_matches_only_the_exact_marker(world):
    (ref,) = world.add_issues(1)
    command = close_command(ref, reconcile_first=True)
    for n in range(230):
        world.add_comment(ref, f"chatter {n} " + (command.marker[:-1] if n % 50 == 0 else ""))
    world.add_comment(ref, "written by an earlier dispatch\n" + command.marker)
    world.clear_requests()
    result, _ = executor().close(world.adapter(), command)
    assert isinstance(result, ConnectorReceipt) and len(world.comments(ref)) == 231
    starts = [query_of(r)["startAt"] for r in world.transport.requests if r.url.path.endswith("/comment")]
    assert starts == ["0", "100", "200"]  # every page, oldest first, and no new comment


def test_a_comment_deleted_during_the_lookup_makes_it_inconclusive(world):
    (ref,) = world.add_issues(1)
    filler = [{"id": str(n), "body": to_adf(f"c{n}")} for n in range(100)]
    world.fail_next("comment", "apply_then_timeout")
    shrinking = (Fault(status=200, body={"startAt": 0, "total": 150, "comments": filler}),
                 Fault(status=200, body={"startAt": 100, "total": 120, "comments": filler[:20]}))
    world.state.faults.push("get_comments", *shrinking * RECONCILE_READS)  # every read of the lookup sees it
    result = world.adapter().comment_and_close(close_command(ref), _attempt())
    assert isinstance(result, AmbiguousWrite) and "deleted" in result.detail


def test_a_lookup_that_saw_a_deletion_is_read_again_and_finds_the_marker(world):
    (ref,) = world.add_issues(1)
    filler = [{"id": str(n), "body": to_adf(f"c{n}")} for n in range(100)]
    world.fail_next("comment", "apply_then_timeout")
    world.state.faults.push("get_comments", Fault(status=200, body={"startAt": 0, "total": 150, "comments": filler}),
                            Fault(status=200, body={"startAt": 100, "total": 120, "comments": filler[:20]}))
    result = world.adapter().comment_and_close(close_command(ref), _attempt())
    assert isinstance(result, ConnectorReceipt) and len(world.comments(ref)) == 1
