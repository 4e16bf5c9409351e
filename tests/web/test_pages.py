"""The ticket pages over HTTP: sign-in and its cookie, CSRF on every form, controls the
server renders only for an authorized actor and re-checks on submit, forged and replayed
posts, and the same counts and states after a restart."""

from __future__ import annotations

import re

import httpx
import pytest
from starlette.testclient import TestClient

from nexus_pipelines.tickets.web.app import build_app
from tests.web.support import hidden, seed, served, text_of


@pytest.fixture(scope="module")
def seeded(pool):
    return seed(pool)


def client(pool, **kw) -> TestClient:
    base = "https://testserver" if kw.get("secure_cookies") else "http://testserver"
    return TestClient(build_app(pool, **kw), base_url=base, follow_redirects=False)


def signed_in(pool, credential: str, **kw) -> TestClient:
    browser = client(pool, **kw)
    page = browser.get("/signin")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    answer = browser.post("/signin", data={"csrf": csrf, "credential": credential})
    assert answer.status_code == 303 and answer.headers["location"] == "/board", answer.text
    return browser


def _facts(pool, ticket_id):
    with pool.connection() as conn:
        return conn.execute("SELECT (SELECT count(*) FROM ticket_priority_facts WHERE ticket_id = %(t)s),"
                            " (SELECT count(*) FROM ticket_triage_facts WHERE ticket_id = %(t)s)",
                            {"t": ticket_id}).fetchone()


def test_pages_need_a_session_and_sign_in_sets_a_strict_httponly_cookie(pool, seeded):
    anonymous = client(pool)
    for path in ("/board", "/attention", f"/tickets/{seeded.ticket_ids[0]}"):
        assert anonymous.get(path).headers["location"] == "/signin"
    page = anonymous.get("/signin")
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    wrong = anonymous.post("/signin", data={"csrf": csrf, "credential": seeded.commander[:-2] + "xx"})
    assert wrong.status_code == 401 and "not valid" in wrong.text and "np_session" not in wrong.headers.get(
        "set-cookie", "")
    no_csrf = client(pool).post("/signin", data={"csrf": csrf, "credential": seeded.commander})
    assert no_csrf.status_code == 403  # no sign-in cookie: a cross-site post cannot sign anyone in
    browser = client(pool, secure_cookies=True)
    csrf = re.search(r'name="csrf" value="([^"]+)"', browser.get("/signin").text).group(1)
    answer = browser.post("/signin", data={"csrf": csrf, "credential": seeded.commander})
    cookie = next(c for c in answer.headers.get_list("set-cookie") if c.startswith("np_session="))
    assert {"HttpOnly", "SameSite=strict", "Secure", "Path=/"} <= {p.strip() for p in cookie.split(";")}
    assert seeded.commander not in answer.headers["location"] and seeded.commander not in cookie


def test_the_board_counts_filters_and_attention_lists_oldest_first(pool, seeded):
    browser = signed_in(pool, seeded.commander)
    board = browser.get("/board").text
    assert text_of(board, "untriaged-count") == "3" and text_of(board, "attention-count") == "3"
    assert all(f'data-ticket="{t}"' in board for t in seeded.ticket_ids)
    accepted = browser.get("/board?triage=ACCEPTED").text
    assert not any(f'data-ticket="{t}"' in accepted for t in seeded.ticket_ids) and "No tickets." in accepted
    attention = browser.get("/attention").text
    order = [int(t) for t in re.findall(r'<tr data-ticket="(\d+)"', attention)]
    with pool.connection() as conn:
        oldest_first = [r[0] for r in conn.execute(
            "SELECT ticket_id FROM attention_findings WHERE ticket_id = ANY(%s) ORDER BY opened_at",
            (seeded.ticket_ids,))]
    assert order == oldest_first and sorted(order) == seeded.ticket_ids


def test_a_lane_longer_than_the_board_shows_says_how_many_it_holds(pool, seeded, monkeypatch):
    monkeypatch.setattr("nexus_pipelines.tickets.board.LANE_LIMIT", 2)
    board = signed_in(pool, seeded.commander).get("/board").text
    assert sum(f'data-ticket="{t}"' in board for t in seeded.ticket_ids) == 2
    assert re.search(r'data-lane="open">\s*<h2>Open <span class="pill">3</span>', board)
    assert "first\n2 of 3" in text_of(board, "more-open") and 'data-testid="more-done"' not in board


def test_controls_follow_the_role_and_a_forged_or_crosssite_post_is_refused(pool, seeded):
    ticket = seeded.ticket_ids[0]
    operator = signed_in(pool, seeded.operator)
    page = operator.get(f"/tickets/{ticket}").text
    assert 'data-testid="priority-form"' in page and 'data-testid="triage-form"' not in page
    fields = hidden(page, "priority-form")
    before = _facts(pool, ticket)
    forged = operator.post(f"/tickets/{ticket}/triage", data={
        **fields, "disposition": "REJECTED", "reason": "forged", "role": "commander", "actor": "someone-else"})
    assert forged.status_code == 403 and "triage needs commander" in forged.text
    assert operator.post(f"/tickets/{ticket}/priority", data={**fields, "csrf": "x", "priority": "P1",
                                                               "reason": "r"}).status_code == 403
    assert operator.post(f"/tickets/{ticket}/priority", data={k: v for k, v in fields.items() if k != "csrf"} | {
        "priority": "P1", "reason": "r"}).status_code == 403
    commander = signed_in(pool, seeded.commander)
    theirs = hidden(commander.get(f"/tickets/{ticket}").text, "priority-form")
    assert operator.post(f"/tickets/{ticket}/priority", data={**fields, "csrf": theirs["csrf"], "priority": "P1",
                                                               "reason": "r"}).status_code == 403
    assert _facts(pool, ticket) == before
    outsider = signed_in(pool, seeded.outsider)
    assert outsider.get(f"/tickets/{ticket}").status_code == 404  # another project's ticket reads as absent
    assert f'data-ticket="{ticket}"' not in outsider.get("/board").text


def test_a_decision_posts_once_replays_and_a_stale_form_conflicts(pool, seeded):
    ticket = seeded.ticket_ids[1]
    commander = signed_in(pool, seeded.commander)
    page = commander.get(f"/tickets/{ticket}").text
    assert 'data-testid="triage-form"' in page and "(automatic default at intake)" in page
    fields = hidden(page, "priority-form")
    answer = commander.post(f"/tickets/{ticket}/priority", data={**fields, "priority": "P1", "reason": "urgent"})
    assert answer.status_code == 303 and answer.headers["location"].endswith("done=priority")
    replayed = commander.post(f"/tickets/{ticket}/priority", data={**fields, "priority": "P1", "reason": "urgent"})
    assert replayed.headers["location"].endswith("done=replayed") and _facts(pool, ticket) == (2, 1)
    stale = commander.post(f"/tickets/{ticket}/triage", data={
        **hidden(page, "triage-form"), "client_command_id": "fresh-id", "disposition": "ACCEPTED", "reason": "ok"})
    assert stale.status_code == 409 and "it changed since you read it" in stale.text
    fresh = commander.get(f"/tickets/{ticket}").text
    accepted = commander.post(f"/tickets/{ticket}/triage", data={
        **hidden(fresh, "triage-form"), "disposition": "ACCEPTED", "reason": "confirmed"})
    assert accepted.status_code == 303
    shown = commander.get(accepted.headers["location"]).text
    assert text_of(shown, "triage-state") == "ACCEPTED" and "Triage recorded." in shown
    assert 'data-testid="triage-form"' not in shown and "resolved: ACCEPTED" in shown


def test_signing_out_ends_the_session_and_a_replayed_cookie_is_refused(pool, seeded):
    browser = signed_in(pool, seeded.operator)
    cookie = browser.cookies.get("np_session")
    csrf = hidden(browser.get(f"/tickets/{seeded.ticket_ids[2]}").text, "priority-form")["csrf"]
    assert browser.post("/signout", data={"csrf": "forged"}).status_code == 403  # a forged sign-out is refused
    assert browser.post("/signout", data={"csrf": csrf}).headers["location"] == "/signin"
    replay = client(pool)
    replay.cookies.set("np_session", cookie)
    assert replay.get("/board").headers["location"] == "/signin"
    assert replay.post(f"/tickets/{seeded.ticket_ids[2]}/priority", data={"csrf": csrf}).status_code == 401


def _snapshot(base_url: str, credential: str, ticket_id: int):
    with httpx.Client(base_url=base_url, timeout=10) as browser:
        csrf = re.search(r'name="csrf" value="([^"]+)"', browser.get("/signin").text).group(1)
        assert browser.post("/signin", data={"csrf": csrf, "credential": credential}).status_code == 303
        board, detail, attention = (browser.get(path).text for path in ("/board", f"/tickets/{ticket_id}",
                                                                        "/attention"))
    return (text_of(board, "untriaged-count"), text_of(board, "attention-count"), text_of(detail, "triage-state"),
            text_of(detail, "priority"), re.findall(r'<tr data-ticket="(\d+)"', attention))


def test_board_detail_and_attention_show_the_same_after_a_restart(seeded, control_dsn, free_tcp_port):
    with served(control_dsn, free_tcp_port) as url:
        before = _snapshot(url, seeded.commander, seeded.ticket_ids[0])
    with served(control_dsn, free_tcp_port) as url:  # a new server process: only the database survives
        after = _snapshot(url, seeded.commander, seeded.ticket_ids[0])
    assert after == before and before[0] == before[1] == str(len(before[4]))


def test_tickets_serve_serves_the_pages_over_http(control_dsn, free_tcp_port):
    with served(control_dsn, free_tcp_port) as url:
        answer = httpx.get(f"{url}/board", follow_redirects=True, timeout=5)
    assert answer.status_code == 200 and answer.url.path == "/signin" and 'name="credential"' in answer.text


def test_tickets_serve_refuses_an_unreachable_control_plane_in_one_line():
    from click.testing import CliRunner

    from nexus_pipelines.cli import main

    result = CliRunner().invoke(main, ["tickets", "serve"], env={"NEXUS_PG_DSN": "host=127.0.0.1 port=1 dbname=x"})
    assert result.exit_code == 1 and "cannot reach the control plane" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_tickets_serve_beyond_loopback_needs_secure_cookies():
    from click.testing import CliRunner

    from nexus_pipelines.cli import main

    result = CliRunner().invoke(main, ["tickets", "serve", "--host", "0.0.0.0"],
                                env={"NEXUS_PG_DSN": "host=127.0.0.1 port=1 dbname=x"})
    assert result.exit_code == 1 and "--secure-cookies" in result.output
    assert len(result.output.strip().splitlines()) == 1
