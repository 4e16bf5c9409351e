"""The Jira simulator is at least as strict as Jira Cloud's documentation for what the connector
sends: the enhanced search and its page tokens, JQL dates, comments in ADF, transitions,
scoped API tokens on basic auth, permissions, rate limits and the fault rows."""

from __future__ import annotations

import base64
import secrets
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from nexus_pipelines.local.simulators.http import Fault, SimulatorTransport, TransportFault, serve_in_thread
from nexus_pipelines.local.simulators.jira import (
    BUG,
    READ_SCOPE,
    WRITE_SCOPE,
    JiraSimulator,
    JiraState,
    RateLimit,
    build_jira_app,
)
from nexus_pipelines.local.simulators.gitlab import SimClock

START = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
SITE = str(uuid.uuid4())
EMAIL, ACCOUNT = "bot@example.test", "712020:bot"
ORDER = "ORDER BY updated ASC, id ASC"


@pytest.fixture
def token():
    return "ATATT3x" + secrets.token_urlsafe(48)


@pytest.fixture
def state(token):
    state = JiraState(SimClock(START))
    state.add_project(SITE, 10000, "PLAT")
    state.add_account(ACCOUNT, EMAIL, "bot", "Europe/Berlin")
    state.add_token(token, EMAIL)
    state.grant(SITE, 10000, ACCOUNT)
    return state


def basic(email: str, value: str) -> str:
    return "Basic " + base64.b64encode(f"{email}:{value}".encode()).decode()


@pytest.fixture
def client(state, token):
    with httpx.Client(base_url=f"https://api.atlassian.test/ex/jira/{SITE}/rest/api/3",
                      transport=SimulatorTransport(JiraSimulator(state)),
                      headers={"Authorization": basic(EMAIL, token), "Accept": "application/json"}) as client:
        yield client


def seed(state, n, *, step=timedelta(milliseconds=1), **kwargs):
    return [state.add_issue(SITE, 10000, summary=f"i{i}", updated_at=START + i * step, **kwargs) for i in range(n)]


def search(client, jql=f"project = 10000 {ORDER}", **params):
    return client.get("/search/jql", params={"jql": jql, "fields": "summary,updated", **params})


# -- the enhanced search ----------------------------------------------------------------------


def test_pages_carry_a_token_until_the_last_which_has_none_and_is_last(state, client):
    seed(state, 5)
    first = search(client, maxResults=2).json()
    assert len(first["issues"]) == 2 and first["isLast"] is False and first["nextPageToken"]
    second = search(client, maxResults=2, nextPageToken=first["nextPageToken"]).json()
    third = search(client, maxResults=2, nextPageToken=second["nextPageToken"]).json()
    assert third["isLast"] is True and "nextPageToken" not in third
    assert [i["fields"]["summary"] for p in (first, second, third) for i in p["issues"]] == [f"i{n}" for n in range(5)]


def test_fields_default_to_the_id_and_pages_with_fields_hold_at_most_a_hundred(state, client):
    seed(state, 150)
    ids_only = client.get("/search/jql", params={"jql": f"project = 10000 {ORDER}", "maxResults": 150}).json()
    assert len(ids_only["issues"]) == 150 and set(ids_only["issues"][0]) == {"id"}
    assert len(search(client).json()["issues"]) == 50  # maxResults defaults to 50
    assert len(search(client, maxResults=150).json()["issues"]) == 100


def test_a_page_token_is_bound_to_its_query_signed_and_expires_after_seven_days(state, client):
    seed(state, 3)
    token = search(client, maxResults=1).json()["nextPageToken"]
    other = search(client, jql=f"project = PLAT {ORDER}", maxResults=1, nextPageToken=token)
    assert other.status_code == 400 and "does not belong" in other.json()["errorMessages"][0]
    edited = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    assert search(client, maxResults=1, nextPageToken=edited).status_code == 400
    state.clock.advance(7 * 24 * 3600)
    expired = search(client, maxResults=1, nextPageToken=token)
    assert expired.status_code == 400 and "expired" in expired.json()["errorMessages"][0]


def test_ties_are_ordered_by_id_and_an_update_between_pages_moves_the_issue_past_the_position(state, client):
    issues = seed(state, 6, step=timedelta(0))  # one updated time for all
    first = search(client, maxResults=3).json()
    assert [i["id"] for i in first["issues"]] == [str(i.id) for i in issues[:3]]
    state.clock.advance(1)
    state.update_issue(SITE, issues[0].id, summary="moved")
    rest = search(client, maxResults=10, nextPageToken=first["nextPageToken"]).json()
    assert [i["id"] for i in rest["issues"]] == [str(i.id) for i in (*issues[3:], issues[0])]


def test_jql_dates_are_minutes_in_the_accounts_time_zone(state, client):
    seed(state, 3, step=timedelta(minutes=1))  # 09:00, 09:01, 09:02 UTC = 10:00.. in Berlin (CET)
    hits = search(client, jql=f'project = 10000 AND updated >= "2026-11-01 10:01" {ORDER}').json()["issues"]
    assert [i["fields"]["summary"] for i in hits] == ["i1", "i2"]
    assert hits[0]["fields"]["updated"] == "2026-11-01T10:01:00.000+0100"  # rendered with the account's offset
    with_seconds = search(client, jql=f'project = 10000 AND updated >= "2026-11-01 10:01:30" {ORDER}')
    assert with_seconds.status_code == 400 and "yyyy-MM-dd HH:mm" in with_seconds.json()["errorMessages"][0]


@pytest.mark.parametrize("jql, message", [
    ("ORDER BY key DESC", "Unbounded"),
    (f'created >= "2026-01-01" {ORDER}', "restricted to one project"),
    (f"project = 99 {ORDER}", "does not exist for the field 'project'"),
    ("project = 10000 ORDER BY summary", "Not able to sort"),
    ("project = 10000 AND summary ~ x", "Expecting"),
    ("project = 10000 ORDER BY updated, id, key, created, updated, id, key, created", "at most 7"),
])
def test_an_invalid_or_unbounded_query_is_a_400_with_error_messages(state, client, jql, message):
    response = search(client, jql=jql)
    assert response.status_code == 400 and message in response.json()["errorMessages"][0]


@pytest.mark.parametrize("params", [{"maxResults": "0"}, {"maxResults": "many"}, {"fields": "summary,nope"},
                                    {"startAt": "5"}])
def test_parameters_outside_the_documented_ones_are_refused(state, client, params):
    assert search(client, **params).status_code == 400


def test_changes_stay_out_of_search_until_indexed(state, client):
    state.index_lag = timedelta(seconds=10)
    seed(state, 1)
    state.clock.advance(5)
    assert search(client).json()["issues"] == []
    state.clock.advance(6)
    assert len(search(client).json()["issues"]) == 1


def test_an_issue_indexed_late_stays_out_of_search_until_then_whatever_its_updated_says(state, client):
    late, other = seed(state, 2)
    state.index_late(SITE, late.id, state.clock.now() + timedelta(seconds=30))
    assert [i["id"] for i in search(client).json()["issues"]] == [str(other.id)]
    state.clock.advance(30)  # now it appears where its (earlier) update time sorts it: first
    assert [i["id"] for i in search(client).json()["issues"]] == [str(late.id), str(other.id)]


# -- credentials, permissions, limits ---------------------------------------------------------


def test_basic_auth_needs_the_tokens_own_email_an_unexpired_token_and_the_scope(state, client, token):
    assert search(client).status_code == 200
    for header in (basic("other@example.test", token), f"Bearer {token}", basic(EMAIL, "wrong")):
        refused = client.get("/search/jql", params={"jql": f"project = 10000 {ORDER}"},
                             headers={"Authorization": header})
        assert refused.status_code == 401 and refused.json() == {"code": 401, "message": "Unauthorized"}
    state.tokens[token].scopes = (READ_SCOPE,)
    (issue,) = seed(state, 1)
    write = client.post(f"/issue/{issue.id}/comment", json={"body": {"type": "doc", "version": 1, "content": []}})
    assert write.status_code == 401 and write.json()["message"] == "Unauthorized; scope does not match"
    state.tokens[token].expires_at = state.clock.now()
    assert search(client).status_code == 401


def test_myself_answers_the_calling_account_with_its_profile_zone_and_needs_read_jira_user(state, client, token):
    me = client.get("/myself")
    assert me.status_code == 200
    assert {k: me.json()[k] for k in ("accountId", "emailAddress", "timeZone", "accountType")} == {
        "accountId": ACCOUNT, "emailAddress": EMAIL, "timeZone": "Europe/Berlin", "accountType": "atlassian"}
    state.accounts[ACCOUNT].time_zone = "America/Los_Angeles"
    assert client.get("/myself").json()["timeZone"] == "America/Los_Angeles"
    assert client.get("/myself", params={"fields": "x"}).status_code == 400
    state.tokens[token].scopes = (READ_SCOPE, WRITE_SCOPE)
    refused = client.get("/myself")
    assert refused.status_code == 401 and refused.json()["message"] == "Unauthorized; scope does not match"


def test_without_browse_an_issue_is_not_found_and_without_transition_none_is_listed(state, client):
    (issue,) = seed(state, 1)
    state.grant(SITE, 10000, ACCOUNT, permissions=("BROWSE_PROJECTS",))
    assert client.get(f"/issue/{issue.id}/transitions").json()["transitions"] == []
    assert client.post(f"/issue/{issue.id}/comment", json={"body": {"type": "doc", "version": 1,
                                                                   "content": []}}).status_code == 403
    state.grant(SITE, 10000, ACCOUNT, permissions=())
    assert client.get(f"/issue/{issue.id}").status_code == 404


def test_the_rate_limit_answers_429_with_retry_after_and_the_reset_minute(state, client):
    state.rate_limit = RateLimit(limit=2, window_s=60)
    assert [search(client).status_code for _ in range(3)] == [200, 200, 429]
    limited = search(client)
    assert int(limited.headers["Retry-After"]) > 0 and limited.headers["X-RateLimit-Remaining"] == "0"
    assert limited.headers["RateLimit-Reason"] == "jira-quota-based"
    assert datetime.strptime(limited.headers["X-RateLimit-Reset"], "%Y-%m-%dT%H:%MZ")
    assert state.limited_calls == 1  # the request after the window's first 429


def test_every_answer_is_dated_by_the_simulators_clock(state, client):
    assert search(client).headers["Date"] == "Sun, 01 Nov 2026 09:00:00 GMT"


# -- comments and transitions -----------------------------------------------------------------


def test_a_comment_must_be_an_adf_document_in_json_and_touches_the_issue(state, client):
    (issue,) = seed(state, 1)
    doc = {"type": "doc", "version": 1, "content": [{"type": "paragraph", "content": [{"type": "text", "text": "hi"}]}]}
    assert client.post(f"/issue/{issue.id}/comment", json={"body": "plain text"}).status_code == 400
    assert client.post(f"/issue/{issue.id}/comment", json={"body": {**doc, "content": [{"type": "marquee"}]}}
                       ).status_code == 400
    assert client.post(f"/issue/{issue.id}/comment", json={"body": doc, "extra": 1}).status_code == 400
    assert client.post(f"/issue/{issue.id}/comment", content=b'{"body": {}}',
                       headers={"Content-Type": "text/plain"}).status_code == 415
    too_long = {**doc, "content": [{"type": "paragraph", "content": [{"type": "text", "text": "x" * 32_768}]}]}
    assert client.post(f"/issue/{issue.id}/comment", json={"body": too_long}).status_code == 400
    state.clock.advance(5)
    created = client.post(f"/issue/{issue.id}/comment", json={"body": doc})
    assert created.status_code == 201 and created.json()["body"] == doc and created.json()["id"].isdigit()
    assert state.issue(SITE, issue.id).updated == state.clock.now()


def test_comments_are_offset_pages_with_a_total_ordered_by_creation(state, client):
    (issue,) = seed(state, 1)
    for n in range(5):
        state.add_comment(SITE, issue.id, f"c{n}")
        state.clock.advance(1)
    page = client.get(f"/issue/{issue.id}/comment", params={"startAt": 3, "maxResults": 2, "orderBy": "created"})
    assert page.json()["total"] == 5 and page.json()["startAt"] == 3
    assert [c["body"]["content"][0]["content"][0]["text"] for c in page.json()["comments"]] == ["c3", "c4"]
    assert client.get(f"/issue/{issue.id}/comment", params={"orderBy": "author"}).status_code == 400


def test_transitions_belong_to_the_work_types_workflow_and_the_current_status(state, client):
    task, bug = seed(state, 1)[0], state.add_issue(SITE, 10000, summary="bug", issuetype=BUG)
    listed = {i.issuetype: {t["id"]: t["to"]["id"] for t in client.get(f"/issue/{i.id}/transitions").json()
                            ["transitions"]} for i in (task, bug)}
    # the task's global transitions are all offered, "To Do" (11) while the task is To Do too
    assert listed == {10001: {"11": "10000", "21": "10001", "31": "10002"},
                      BUG: {"41": "10001", "51": "10002", "71": "10003"}}
    assert client.post(f"/issue/{bug.id}/transitions", json={"transition": {"id": "31"}}).status_code == 400
    assert client.post(f"/issue/{bug.id}/transitions", json={"transition": {"id": "71"}}).status_code == 400
    assert client.post(f"/issue/{bug.id}/transitions", json={"transition": 51}).status_code == 400
    done = client.post(f"/issue/{bug.id}/transitions", json={"transition": {"id": "51"}})
    assert done.status_code == 204 and done.content == b"" and state.issue(SITE, bug.id).status == 10002
    assert "51" not in {t["id"] for t in client.get(f"/issue/{bug.id}/transitions").json()["transitions"]}
    assert client.post(f"/issue/{task.id}/transitions", json={"transition": {"id": "31"}}).status_code == 204
    again = client.get(f"/issue/{task.id}/transitions").json()["transitions"]
    assert {"31": True} == {t["id"]: t["isGlobal"] for t in again if t["to"]["id"] == "10002"}  # Done while Done


# -- faults ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault, error", [
    (TransportFault.CONNECT_ERROR, httpx.ConnectError),
    (TransportFault.RESET_BEFORE_RESPONSE, httpx.ReadError),
    (TransportFault.PROTOCOL_ERROR, httpx.RemoteProtocolError),
    (TransportFault.TIMEOUT_BEFORE_APPLY, httpx.ReadTimeout),
])
def test_a_transport_fault_before_applying_writes_nothing(state, client, fault, error):
    (issue,) = seed(state, 1)
    state.faults.push("add_comment", Fault(transport=fault))
    with pytest.raises(error):
        client.post(f"/issue/{issue.id}/comment", json={"body": {"type": "doc", "version": 1, "content": []}})
    assert state.issue(SITE, issue.id).comments == []


@pytest.mark.parametrize("fault, error", [
    (TransportFault.APPLY_THEN_TIMEOUT, httpx.ReadTimeout),
    (TransportFault.APPLY_THEN_RESET, httpx.ReadError),
    (TransportFault.APPLY_THEN_DROP, httpx.RemoteProtocolError),
])
def test_a_transport_fault_after_applying_keeps_the_write(state, client, fault, error):
    (issue,) = seed(state, 1)
    state.faults.push("do_transition", Fault(transport=fault))
    with pytest.raises(error):
        client.post(f"/issue/{issue.id}/transitions", json={"transition": {"id": "31"}})
    assert state.issue(SITE, issue.id).status == 10002


def test_a_status_fault_after_applying_keeps_the_write_and_answers_the_status(state, client):
    (issue,) = seed(state, 1)
    state.faults.push("add_comment", Fault(after_apply_status=502))
    doc = {"type": "doc", "version": 1, "content": []}
    assert client.post(f"/issue/{issue.id}/comment", json={"body": doc}).status_code == 502
    assert len(state.issue(SITE, issue.id).comments) == 1


def test_the_served_app_answers_over_real_http_and_its_data_survives_a_restart(state, token, tmp_path):
    seed(state, 2)
    url, stop = serve_in_thread(build_jira_app(state))
    try:
        response = httpx.get(f"{url}/ex/jira/{SITE}/rest/api/3/search/jql",
                             params={"jql": f"project = 10000 {ORDER}", "fields": "summary"},
                             headers={"Authorization": basic(EMAIL, token)})
    finally:
        stop()
    assert response.status_code == 200 and len(response.json()["issues"]) == 2
    state.save(tmp_path / "jira.json")
    again = JiraState(SimClock(START))
    assert again.load(tmp_path / "jira.json") and sorted(i.summary for i in again.issues.values()) == ["i0", "i1"]
