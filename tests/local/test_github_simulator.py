"""The GitHub simulator is at least as strict as GitHub's documentation for what the connector sends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import jwt
import pytest

from nexus_pipelines.local.simulators.github import (
    DEEP_PAGE_MESSAGE,
    GitHubSimulator,
    GitHubState,
    PrimaryLimit,
    SecondaryLimit,
    build_github_app,
)
from nexus_pipelines.local.simulators.gitlab import SimClock
from nexus_pipelines.local.simulators.http import SimulatorTransport, serve_in_thread
from nexus_pipelines.local.worlds.github_keys import new_key_pair, shared_key_pair

START = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
HEADERS = {"User-Agent": "simulator-test", "X-GitHub-Api-Version": "2022-11-28"}


@pytest.fixture
def state():
    state = GitHubState(SimClock(START))
    state.add_app(1, shared_key_pair()[1])
    state.add_repository(10, "acme", "app")
    state.add_repository(11, "acme", "other")
    state.install(5, 1, [10, 11])
    return state


@pytest.fixture
def client(state):
    with httpx.Client(base_url="https://api.github.test", transport=SimulatorTransport(GitHubSimulator(state)),
                      headers=HEADERS) as client:
        yield client


def app_jwt(now=START, *, iat_offset=-60, exp_offset=540, key=None, iss="1"):
    moment = int(now.timestamp())
    return jwt.encode({"iat": moment + iat_offset, "exp": moment + exp_offset, "iss": iss},
                      key or shared_key_pair()[0], algorithm="RS256")


def mint(client, body=None, token=None):
    return client.post("/app/installations/5/access_tokens", json=body or {"repository_ids": [10]},
                       headers={"Authorization": f"Bearer {token or app_jwt()}"})


def authed(client, body=None):
    token = mint(client, body).json()["token"]
    client.headers["Authorization"] = f"token {token}"
    return token


def seed(state, n, *, repo=10, step_s=0, pull_every=0):
    for i in range(n):
        state.add_issue(repo, title=f"i{i}", updated_at=START + timedelta(seconds=i * step_s),
                        pull_request=bool(pull_every) and i % pull_every == 0)


@pytest.mark.parametrize("kwargs, words", [
    ({"iat_offset": 120}, "'Issued at' claim ('iat')"),
    ({"exp_offset": 601}, "is too far in the future"),
    ({"exp_offset": -1}, "must be a numeric value representing the future time"),
    ({"key": new_key_pair()[0]}, "A JSON web token could not be decoded"),
    ({"iss": "2"}, "A JSON web token could not be decoded"),
])
def test_app_jwts_are_verified_against_the_registered_key_and_githubs_time_rules(client, kwargs, words):
    response = mint(client, token=app_jwt(**kwargs))
    assert response.status_code == 401 and words in response.json()["message"]
    assert mint(client).status_code == 201


def test_installation_tokens_are_narrowed_expire_after_an_hour_and_need_a_jwt(state, client):
    answer = mint(client, {"repository_ids": [10], "permissions": {"issues": "write", "metadata": "read"}})
    assert answer.status_code == 201 and answer.json()["token"].startswith("ghs_")
    assert answer.json()["expires_at"] == "2026-11-01T10:00:00Z" and [r["id"] for r in answer.json()["repositories"]] \
        == [10]
    token = answer.json()["token"]
    assert client.get("/repos/acme/other/issues", headers={"Authorization": f"token {token}"}).status_code == 404
    assert client.get("/repos/acme/app/issues", headers={"Authorization": f"token {token}"}).status_code == 200
    state.clock.advance(3600)
    refused = client.get("/repos/acme/app/issues", headers={"Authorization": f"token {token}"})
    assert refused.status_code == 401 and refused.json()["message"] == "Bad credentials"
    assert client.post("/app/installations/5/access_tokens", headers={"Authorization": f"token {token}"}
                       ).status_code == 401
    fresh = app_jwt(state.clock.now())
    assert mint(client, {"repository_ids": [99]}, fresh).status_code == 422
    assert mint(client, {"repository_ids": [10], "permissions": {"administration": "write"}}, fresh).status_code == 422
    assert client.post("/app/installations/6/access_tokens", headers={"Authorization": f"Bearer {fresh}"}
                       ).status_code == 404


def test_requests_need_a_user_agent_and_a_known_api_version(client):
    authed(client)
    assert client.get("/repos/acme/app/issues", headers={"User-Agent": ""}).status_code == 403
    assert client.get("/repos/acme/app/issues", headers={"X-GitHub-Api-Version": "2019-01-01"}).status_code == 400


def test_a_missing_permission_is_403_resource_not_accessible_by_integration(state, client):
    seed(state, 1)
    mint_answer = mint(client, {"repository_ids": [10], "permissions": {"issues": "read", "metadata": "read"}})
    client.headers["Authorization"] = f"Bearer {mint_answer.json()['token']}"
    assert client.get("/repos/acme/app/issues").status_code == 200
    refused = client.post("/repos/acme/app/issues/1/comments", json={"body": "x"})
    assert refused.status_code == 403 and refused.json()["message"] == "Resource not accessible by integration"
    assert refused.headers["x-accepted-github-permissions"] == "issues=write"


def test_listing_defaults_validation_and_pull_requests(state, client):
    authed(client)
    seed(state, 3, step_s=1, pull_every=2)
    state.update_issue(10, 3, state="closed", updated_at=START + timedelta(seconds=5))
    default = client.get("/repos/acme/app/issues").json()
    assert [i["number"] for i in default] == [2, 1]  # state=open, sort=created, direction=desc
    assert "pull_request" in default[1] and "pull_request" not in default[0]
    for params in ({"state": "opened"}, {"sort": "updated_at"}, {"direction": "up"}, {"since": "yesterday"},
                   {"per_page": "x"}, {"after": "garbage"}):
        response = client.get("/repos/acme/app/issues", params=params)
        assert response.status_code == 422, params
    assert len(client.get("/repos/acme/app/issues", params={"per_page": 500, "state": "all"}).json()) == 3
    since = client.get("/repos/acme/app/issues", params={"state": "all", "since": "2026-11-01T09:00:01Z"}).json()
    assert [i["number"] for i in since] == [3]  # updated *after* the given time
    assert default[0]["updated_at"] == "2026-11-01T09:00:01Z"  # whole seconds


def test_pages_are_an_after_keyset_over_ties_and_deep_page_numbers_are_refused(state, client):
    authed(client)
    seed(state, 250)  # all in one second
    params = {"state": "all", "sort": "updated", "direction": "asc", "per_page": 100}
    seen, response = [], client.get("/repos/acme/app/issues", params=params)
    while True:
        seen += [i["number"] for i in response.json()]
        link = response.headers.get("Link", "")
        if 'rel="next"' not in link:
            break
        assert "after=" in link and "/repositories/10/issues" in link
        response = client.get(link.split(";")[0].strip("<>"))
    assert sorted(seen) == list(range(1, 251)) and len(seen) == 250
    assert client.get("/repos/acme/app/issues", params={**params, "page": 3}).status_code == 200
    deep = client.get("/repos/acme/app/issues", params={**params, "page": 11})
    assert deep.status_code == 422 and deep.json()["message"] == DEEP_PAGE_MESSAGE


def test_page_number_mode_links_pages_only_and_an_update_shifts_later_rows_back(state, client):
    authed(client)
    state.issue_paging = "page"
    seed(state, 25, step_s=60)
    params = {"state": "all", "sort": "updated", "direction": "asc", "per_page": 10}
    first = client.get("/repos/acme/app/issues", params=params)
    links = dict((rel.split('"')[1], url.strip(" <>")) for url, rel in
                 (part.split(";") for part in first.headers["Link"].split(",")))
    assert set(links) == {"next", "last"} and "after=" not in first.headers["Link"]
    assert "page=2" in links["next"] and "page=3" in links["last"] and "since" not in links["next"]
    assert "sort=updated" in links["next"] and "/repositories/10/issues" in links["next"]
    state.update_issue(10, 2, updated_at=START + timedelta(days=1))  # already read: moves to the end
    second = client.get(links["next"])
    assert [i["number"] for i in second.json()][0] == 12  # 11 shifted back onto page 1: skipped
    assert 'rel="prev"' in second.headers["Link"] and 'rel="first"' in second.headers["Link"]
    last = client.get(links["last"])
    assert "next" not in last.headers["Link"] and [i["number"] for i in last.json()][-1] == 2
    assert "Link" not in client.get("/repos/acme/app/issues", params={**params, "per_page": 100}).headers


def test_an_unchanged_listing_answers_304_to_its_etag_without_spending_the_rate_limit(state, client):
    authed(client)
    state.primary = PrimaryLimit(limit=10)
    seed(state, 2)
    first = client.get("/repos/acme/app/issues")
    assert first.headers["x-ratelimit-remaining"] == "9" and first.headers["ETag"].startswith('W/"')
    again = client.get("/repos/acme/app/issues", headers={"If-None-Match": first.headers["ETag"]})
    assert again.status_code == 304 and again.content == b"" and again.headers["x-ratelimit-remaining"] == "9"
    state.add_issue(10, title="new")
    assert client.get("/repos/acme/app/issues", headers={"If-None-Match": first.headers["ETag"]}).status_code == 200


def test_primary_limits_answer_403_with_githubs_headers_and_count_calls_made_while_limited(state, client):
    authed(client)
    state.primary = PrimaryLimit(limit=2, window_s=60)
    statuses = [client.get("/repos/acme/app/issues").status_code for _ in range(3)]
    assert statuses == [200, 200, 403]
    limited = client.get("/repos/acme/app/issues")
    assert limited.headers["x-ratelimit-remaining"] == "0" and "API rate limit exceeded" in limited.json()["message"]
    assert int(limited.headers["x-ratelimit-reset"]) == int(START.timestamp()) + 60
    assert state.limited_calls == 2
    state.clock.advance(60)
    assert client.get("/repos/acme/app/issues").status_code == 200


@pytest.mark.parametrize("retry_after", [45, None])
def test_secondary_limits_on_content_creation(state, client, retry_after):
    authed(client)
    seed(state, 1)
    state.secondary = SecondaryLimit(creations=1, retry_after=retry_after)
    assert client.post("/repos/acme/app/issues/1/comments", json={"body": "one"}).status_code == 201
    refused = client.post("/repos/acme/app/issues/1/comments", json={"body": "two"})
    assert refused.status_code == 403 and "secondary rate limit" in refused.json()["message"]
    assert refused.headers.get("retry-after") == (str(retry_after) if retry_after else None)



def test_githubs_documented_content_limit_holds_by_default_on_the_simulators_own_clock(state, client):
    authed(client)
    seed(state, 1)  # no limit configured: GitHub's 80 a minute and 500 an hour
    comment = lambda: client.post("/repos/acme/app/issues/1/comments", json={"body": "x"})  # noqa: E731
    assert {comment().status_code for _ in range(80)} == {201}
    refused = comment()  # the 81st in a frozen minute
    assert refused.status_code == 403 and "secondary rate limit" in refused.json()["message"]
    assert refused.headers["retry-after"] == "60"
    state.clock.advance(61)  # the block and the minute are over: the next minute has room again
    assert comment().status_code == 201


def test_content_creation_past_the_hourly_limit_is_refused_though_the_minute_has_room(state, client):
    authed(client)
    seed(state, 1)
    state.secondary = SecondaryLimit(creations=2, hourly_creations=3, retry_after=45)
    comment = lambda: client.post("/repos/acme/app/issues/1/comments", json={"body": "x"})  # noqa: E731
    assert [comment().status_code for _ in range(2)] == [201, 201]
    state.clock.advance(61)
    assert comment().status_code == 201  # the third of the hour, the first of this minute
    refused = comment()
    assert refused.status_code == 403 and refused.headers["retry-after"] == "45"
    assert client.patch("/repos/acme/app/issues/1", json={"state": "closed"}).status_code == 200  # no content
    state.clock.advance(3600)
    token = mint(client, token=app_jwt(state.clock.now())).json()["token"]  # the first one lasted an hour
    client.headers["Authorization"] = f"token {token}"
    assert comment().status_code == 201

def test_a_secondary_limit_blocks_the_installations_creation_from_every_client_until_its_retry_after(state):
    seed(state, 1)
    state.secondary = SecondaryLimit(creations=2, retry_after=45)
    clients = [httpx.Client(base_url="https://api.github.test", transport=SimulatorTransport(GitHubSimulator(state)),
                            headers=HEADERS) for _ in range(2)]
    for c in clients:
        authed(c)  # two tokens of one installation
    comment = lambda c: c.post("/repos/acme/app/issues/1/comments", json={"body": "x"})  # noqa: E731
    assert [comment(c).status_code for c in clients] == [201, 201]
    first = comment(clients[0])
    assert first.status_code == 403 and first.headers["retry-after"] == "45" and state.limited_calls == 0
    state.clock.advance(30)
    again = comment(clients[1])  # the other client, while the block holds: refused and counted
    assert again.status_code == 403 and again.headers["retry-after"] == "15" and state.limited_calls == 1
    assert clients[1].get("/repos/acme/app/issues/1").status_code == 200  # reads are not content creation
    state.clock.advance(31)  # the block is over and the minute's two creations have aged out
    assert comment(clients[1]).status_code == 201


def test_a_renamed_repository_answers_301_to_reads_and_307_to_writes(state, client):
    authed(client)
    seed(state, 1)
    state.rename(10, "acme", "app-renamed")
    read = client.get("/repos/acme/app/issues", params={"state": "all"})
    assert read.status_code == 301 and read.headers["Location"].endswith("/repositories/10/issues?state=all")
    write = client.patch("/repos/acme/app/issues/1", json={"state": "closed"})
    assert write.status_code == 307 and state.issue(10, 1).state == "open"
    assert client.get("/repos/acme/app-renamed/issues").status_code == 200


def test_comments_and_updates_validate_their_bodies(state, client):
    authed(client)
    seed(state, 1)
    url = "/repos/acme/app/issues/1"
    assert client.post(f"{url}/comments", content=b"{", headers={"content-type": "application/json"}
                       ).status_code == 400
    assert client.post(f"{url}/comments", json=["body"]).status_code == 400
    assert client.post(f"{url}/comments", json={"body": ""}).status_code == 422
    assert client.post(f"{url}/comments", json={"body": "x" * 65537}).status_code == 422
    state.clock.advance(5)
    created = client.post(f"{url}/comments", json={"body": "hello"})
    assert created.status_code == 201 and state.issue(10, 1).updated_at == START + timedelta(seconds=5)
    assert client.patch(url, json={"state": "shut"}).status_code == 422
    assert client.patch(url, json={"state": "closed", "state_reason": "fixed"}).status_code == 422
    closed = client.patch(url, json={"state": "closed", "state_reason": "completed"}).json()
    assert (closed["state"], closed["state_reason"]) == ("closed", "completed") and closed["closed_at"]
    for n in range(120):
        state.add_comment(10, 1, f"c{n}")
    first = client.get(f"{url}/comments", params={"per_page": 100})
    assert len(first.json()) == 100 and 'rel="next"' in first.headers["Link"]
    assert [c["body"] for c in first.json()][:1] == ["hello"]  # ascending id


def test_the_served_app_answers_like_the_in_process_transport(state):
    seed(state, 2)
    url, stop = serve_in_thread(build_github_app(state))
    state.clock = SimClock()  # real time: the served app and the JWT share the wall clock
    try:
        signed = app_jwt(datetime.now(UTC))
        token = httpx.post(f"{url}/app/installations/5/access_tokens", json={"repository_ids": [10]},
                           headers={**HEADERS, "Authorization": f"Bearer {signed}"}).json()["token"]
        response = httpx.get(f"{url}/repos/acme/app/issues", headers={**HEADERS, "Authorization": f"Bearer {token}"})
    finally:
        stop()
    assert response.status_code == 200 and len(response.json()) == 2 and "Date" in response.headers


def test_state_survives_a_save_and_load(state, tmp_path):
    issue = state.add_issue(10, title="kept", labels=["bug"])
    state.add_comment(10, issue.number, "remember me")
    state.rename(10, "acme", "app2")
    state.save(tmp_path / "github.json")
    restored = GitHubState()
    assert restored.load(tmp_path / "github.json")
    again = restored.issue(10, issue.number)
    assert (again.title, again.labels, [c.body for c in again.comments]) == ("kept", ["bug"], ["remember me"])
    assert restored.repositories[10].full_name == "acme/app2" and "acme/app" in restored.repositories[10].former_names
    assert restored.add_issue(10, title="next").id > again.comments[0].id
