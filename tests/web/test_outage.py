"""The pages through a control-plane outage, on a real Postgres that is stopped and started
again under a running `tickets serve`: every request answers a one-line 503 naming the
control plane and `make up`, the server logs the outage once (not a traceback per request),
and the pages answer again once the server is back."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from nexus_pipelines.control.migrations import apply_migrations
from nexus_pipelines.local.postgres import FAST_SETTINGS, EmbeddedPostgres, ensure_database
from nexus_pipelines.local.worlds.plant import member
from tests.web.support import serving


@pytest.fixture
def server(tmp_path):
    postgres = EmbeddedPostgres(tmp_path / "pg", settings=FAST_SETTINGS)
    info = postgres.start()
    ensure_database(info.dsn(), "outage")
    apply_migrations(info.dsn("outage"))
    yield postgres, info.dsn("outage")
    postgres.stop()


def signed_in(base_url: str, credential: str) -> httpx.Client:
    browser = httpx.Client(base_url=base_url, timeout=30)
    csrf = re.search(r'name="csrf" value="([^"]+)"', browser.get("/signin").text).group(1)
    assert browser.post("/signin", data={"csrf": csrf, "credential": credential}).status_code == 303
    return browser


def test_pages_answer_one_line_503_during_an_outage_log_it_once_and_recover(server, free_tcp_port):
    postgres, dsn = server
    from nexus_pipelines.control.db import connect

    with connect(dsn) as conn:  # an actor with no project yet: its board reads the control plane all the same
        actor, credential = member(conn, "acme/outage", None)
    with serving(dsn, free_tcp_port) as process:
        browser = signed_in(f"http://127.0.0.1:{free_tcp_port}", credential)
        assert f'data-testid="actor">{actor.actor_id}<' in browser.get("/board").text

        postgres.stop()
        for path in ("/board", "/attention", "/tickets/1", "/board"):
            answer = browser.get(path)
            assert answer.status_code == 503 and answer.headers["retry-after"] == "10"
            assert answer.text == ("The control plane (Postgres) is unreachable, so the ticket pages cannot be read "
                                   "now: start it with `make up`, then reload this page.")

        postgres.start()  # on the same port again
        deadline = time.monotonic() + 60
        while (answer := browser.get("/board")).status_code != 200:
            assert answer.status_code == 503 and time.monotonic() < deadline, answer.text
        assert f'data-testid="actor">{actor.actor_id}<' in answer.text  # the same session, read again
        browser.close()
        process.terminate()
        output = process.communicate(timeout=10)[0].splitlines()
    logged = [line for line in output if not line.startswith("ticket pages on ")]
    assert len(logged) == 2, output
    assert "control plane unreachable (" in logged[0] and "the pages answer 503 until it is back" in logged[0]
    assert logged[1].endswith("control plane reachable again; the pages answer as usual")
