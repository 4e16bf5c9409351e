"""The GitLab simulator is at least as strict as GitLab's documentation for what the connector sends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from nexus_pipelines.local.simulators.gitlab import (
    GitLabSimulator,
    GitLabState,
    RateLimit,
    SimClock,
    build_gitlab_app,
)
from nexus_pipelines.local.simulators.http import SimulatorTransport, serve_in_thread
from nexus_pipelines.local.worlds.tokens import gitlab_token

TOKEN = gitlab_token("simulator-test-0123456789ab")
START = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def state():
    state = GitLabState(SimClock(START))
    state.add_project(1, "acme/app")
    state.add_token(TOKEN, 1)
    return state


@pytest.fixture
def client(state):
    with httpx.Client(base_url="https://gitlab.test/api/v4", transport=SimulatorTransport(GitLabSimulator(state)),
                      headers={"PRIVATE-TOKEN": TOKEN}) as client:
        yield client


def seed(state, n, *, step_ms=1):
    for i in range(n):
        state.add_issue(1, title=f"i{i}", updated_at=START + timedelta(milliseconds=i * step_ms))


def test_offset_pages_carry_gitlabs_headers_and_an_empty_next_page_at_the_end(state, client):
    seed(state, 5)
    first = client.get("/projects/1/issues", params={"per_page": 2})
    assert first.headers["x-next-page"] == "2" and first.headers["x-total"] == "5"
    assert first.headers["x-total-pages"] == "3" and first.headers["x-page"] == "1"
    last = client.get("/projects/1/issues", params={"per_page": 2, "page": 3})
    assert last.headers["x-next-page"] == "" and 'rel="next"' not in last.headers["Link"]
    assert [i["iid"] for i in first.json()] == [5, 4]  # default order: created_at desc


def test_totals_and_the_last_link_are_dropped_above_ten_thousand_rows(state, client):
    project = state.projects[1]
    template = state.add_issue(1, title="t")
    for iid in range(2, 10_002):
        project.issues[iid] = type(template)(**{**template.__dict__, "iid": iid, "id": 10**6 + iid, "notes": []})
    response = client.get("/projects/1/issues", params={"per_page": 100})
    assert "x-total" not in response.headers and "x-total-pages" not in response.headers
    assert 'rel="last"' not in response.headers["Link"] and response.headers["x-next-page"] == "2"


def test_keyset_pages_link_next_only_and_refuse_unsupported_orders(state, client):
    seed(state, 3)
    page = client.get("/projects/1/issues", params={"pagination": "keyset", "order_by": "updated_at",
                                                    "sort": "asc", "per_page": 2})
    assert 'rel="next"' in page.headers["Link"] and "x-total" not in page.headers and "x-next-page" not in page.headers
    nxt = client.get(page.headers["Link"].split(";")[0].strip("<>"))
    assert [i["iid"] for i in nxt.json()] == [3] and "Link" not in nxt.headers
    refused = client.get("/projects/1/issues", params={"pagination": "keyset", "order_by": "popularity"})
    assert refused.status_code == 405



def _keyset_walk(client, **params) -> list[int]:
    """Every iid a keyset walk returns, page by page, following each page's next link."""
    iids, response = [], client.get("/projects/1/issues", params={"pagination": "keyset", "per_page": 3, **params})
    while True:
        iids += [i["iid"] for i in response.json()]
        if 'rel="next"' not in response.headers.get("Link", ""):
            return iids
        response = client.get(response.headers["Link"].split(";")[0].strip("<>"))


@pytest.mark.parametrize("sort", ["asc", "desc"])
def test_a_keyset_walk_returns_each_matching_issue_once_in_order_past_the_cursor(state, client, sort):
    seed(state, 10)
    for iid in (2, 5, 9):  # filtered out by state=opened wherever the cursor stands
        state.update_issue(1, iid, updated_at=START + timedelta(milliseconds=iid - 1), state="closed")
    walked = _keyset_walk(client, order_by="updated_at", sort=sort, state="opened")
    expected = [1, 3, 4, 6, 7, 8, 10]
    assert walked == (expected if sort == "asc" else expected[::-1])

def test_without_keyset_for_issues_pagination_keyset_is_ignored_and_offset_pages_come_back(state, client):
    state.keyset_for_issues = False
    seed(state, 5, step_ms=60_000)
    params = {"pagination": "keyset", "order_by": "updated_at", "sort": "asc", "per_page": 2}
    first = client.get("/projects/1/issues", params=params)
    assert [i["iid"] for i in first.json()] == [1, 2]
    assert (first.headers["x-page"], first.headers["x-next-page"], first.headers["x-prev-page"],
            first.headers["x-per-page"], first.headers["x-total"]) == ("1", "2", "", "2", "5")
    nxt = first.headers["Link"].split(",")[0].split(";")[0].strip(" <>")
    assert "page=2" in nxt and "cursor=" not in nxt and 'rel="next"' in first.headers["Link"]
    state.update_issue(1, 1, updated_at=START + timedelta(days=1))  # already read: moves to the end
    assert [i["iid"] for i in client.get(nxt).json()] == [4, 5]  # 3 shifted back onto page 1: skipped
    last = client.get("/projects/1/issues", params={**params, "page": 3})
    assert last.headers["x-next-page"] == "" and 'rel="next"' not in last.headers["Link"]


@pytest.mark.parametrize("params, field", [
    ({"order_by": "size"}, "order_by"), ({"sort": "up"}, "sort"), ({"per_page": "0"}, "per_page"),
    ({"updated_after": "yesterday"}, "updated_after"), ({"state": "open"}, "state"),
])
def test_invalid_parameters_are_400(client, params, field):
    response = client.get("/projects/1/issues", params=params)
    assert response.status_code == 400 and field in response.text


def test_per_page_is_capped_at_100_and_updated_after_is_inclusive(state, client):
    seed(state, 120)
    assert len(client.get("/projects/1/issues", params={"per_page": 500}).json()) == 100
    bound = (START + timedelta(milliseconds=100)).isoformat().replace("+00:00", "Z")
    assert len(client.get("/projects/1/issues", params={"per_page": 100, "updated_after": bound}).json()) == 20


def test_notes_validate_their_body_and_touch_the_issue(state, client):
    issue = state.add_issue(1, title="x")
    state.clock.advance(5)
    assert client.post("/projects/1/issues/1/notes", json={"body": "  "}).status_code == 400
    assert client.post("/projects/1/issues/1/notes", json={"body": "x" * 1_000_001}).status_code == 400
    created = client.post("/projects/1/issues/1/notes", json={"body": "hello"})
    assert created.status_code == 201 and created.json()["body"] == "hello"
    assert issue.updated_at == START + timedelta(seconds=5)


def test_state_events_are_validated_and_closing_stamps_closed_at(state, client):
    state.add_issue(1, title="x")
    assert client.put("/projects/1/issues/1", json={"state_event": "shut"}).status_code == 400
    closed = client.put("/projects/1/issues/1", json={"state_event": "close"}).json()
    assert closed["state"] == "closed" and closed["closed_at"] is not None


def test_tokens_are_checked_for_presence_project_and_scope(state):
    state.add_issue(1, title="x")
    state.add_project(2, "acme/other")
    state.add_token(gitlab_token("readonly-0123456789abcdefg"), 1, scopes=("read_api",))
    transport = SimulatorTransport(GitLabSimulator(state))
    with httpx.Client(base_url="https://gitlab.test/api/v4", transport=transport) as anon:
        assert anon.get("/projects/1/issues").status_code == 401
        assert anon.get("/projects/2/issues", headers={"PRIVATE-TOKEN": TOKEN}).status_code == 404
        assert anon.get("/projects/1/issues", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        readonly = {"PRIVATE-TOKEN": gitlab_token("readonly-0123456789abcdefg")}
        assert anon.post("/projects/1/issues/1/notes", json={"body": "x"}, headers=readonly).status_code == 403


def test_rate_limits_answer_429_with_gitlabs_headers(state, client):
    state.rate_limit = RateLimit(limit=2)
    assert [client.get("/projects/1/issues").status_code for _ in range(3)] == [200, 200, 429]
    limited = client.get("/projects/1/issues")
    assert limited.headers["RateLimit-Remaining"] == "0" and int(limited.headers["Retry-After"]) > 0
    assert {"ratelimit-limit", "ratelimit-reset", "ratelimit-resettime", "ratelimit-observed"} <= set(limited.headers)
    assert "Date" in limited.headers
    assert state.limited_calls == 1  # the request after the window's first 429


def test_a_token_limit_is_shared_by_every_client_of_the_token(state):
    state.rate_limit = RateLimit(limit=1)
    clients = [httpx.Client(base_url="https://gitlab.test/api/v4", headers={"PRIVATE-TOKEN": TOKEN},
                            transport=SimulatorTransport(GitLabSimulator(state))) for _ in range(2)]
    assert [c.get("/projects/1/issues").status_code for c in clients] == [200, 429]
    assert state.limited_calls == 0 and clients[0].get("/projects/1/issues").status_code == 429
    assert state.limited_calls == 1


def test_the_served_app_answers_like_the_in_process_transport(state, tmp_path):
    seed(state, 2)
    url, stop = serve_in_thread(build_gitlab_app(state))
    try:
        response = httpx.get(f"{url}/api/v4/projects/1/issues", headers={"PRIVATE-TOKEN": TOKEN})
    finally:
        stop()
    assert response.status_code == 200 and len(response.json()) == 2 and response.headers["x-total"] == "2"


def test_state_survives_a_save_and_load(state, tmp_path):
    issue = state.add_issue(1, title="kept", labels=["bug"])
    state.clock.advance(1)
    client = httpx.Client(base_url="https://gitlab.test/api/v4", transport=SimulatorTransport(GitLabSimulator(state)),
                          headers={"PRIVATE-TOKEN": TOKEN})
    client.post(f"/projects/1/issues/{issue.iid}/notes", json={"body": "remember me"})
    state.save(tmp_path / "gitlab.json")
    restored = GitLabState()
    assert restored.load(tmp_path / "gitlab.json")
    again = restored.issue(1, issue.iid)
    assert (again.title, again.labels, again.updated_at, [n.body for n in again.notes]) == (
        "kept", ["bug"], issue.updated_at, ["remember me"])
    assert restored.add_issue(1, title="next").id > again.notes[0].id
