"""A project with real ingested GitLab tickets and its actors, for the page tests."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

import httpx

from nexus_pipelines.local.worlds.gitlab import PROJECT_ID, GitLabWorld
from nexus_pipelines.local.worlds.plant import Plant, accept, member
from tests.tickets.support import ingest, sweep_gap

_worlds = itertools.count(PROJECT_ID + 2000)


@dataclass(frozen=True)
class Seeded:
    project_id: str
    ticket_ids: list[int]
    commander: str  # credentials, as the people were given them
    operator: str
    outsider: str  # a commander of another project


def seed(pool, issues: int = 3) -> Seeded:
    project, other = f"web-{uuid.uuid4().hex[:6]}", f"web-{uuid.uuid4().hex[:6]}"
    _, ids = ingest(Plant(GitLabWorld(project_id=next(_worlds)), pool), project, issues)
    ingest(Plant(GitLabWorld(project_id=next(_worlds)), pool), other, 1)
    with pool.connection() as conn:
        _, commander = member(conn, f"acme/{project}", "commander", name=f"cmd-{project}")
        _, operator = member(conn, f"acme/{project}", "operator", name=f"op-{project}")
        _, outsider = member(conn, f"acme/{other}", "commander", name=f"out-{other}")
    return Seeded(f"acme/{project}", ids, commander, operator, outsider)


def gap_on_an_accepted_ticket(pool) -> tuple[int, str]:
    """A project of its own whose one accepted ticket has a sweep gap: the ticket and its commander's credential."""
    project = f"gap-{uuid.uuid4().hex[:6]}"
    plant = Plant(GitLabWorld(project_id=next(_worlds)), pool)
    registration, (ticket,) = ingest(plant, project, 1)
    with pool.connection() as conn:
        _, commander = member(conn, f"acme/{project}", "commander", name=f"cmd-{project}")
        accept(conn, ticket)
    sweep_gap(plant, registration, ticket)
    return ticket, commander


@contextlib.contextmanager
def serving(control_dsn: str, port: int):
    """`nexus-pipelines tickets serve` in a process of its own, answering on `port`; yields the
    process (its output is piped, stderr into stdout)."""
    server = subprocess.Popen([sys.executable, "-m", "nexus_pipelines.cli", "tickets", "serve", "--port", str(port)],
                              env={**os.environ, "NEXUS_PG_DSN": control_dsn},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and server.poll() is None:
            try:
                httpx.get(f"http://127.0.0.1:{port}/signin", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert server.poll() is None, server.stdout.read()
        yield server
    finally:
        server.terminate()
        server.wait(timeout=10)


@contextlib.contextmanager
def served(control_dsn: str, port: int):
    """The pages of a `tickets serve` process of their own: yields their base URL."""
    with serving(control_dsn, port):
        yield f"http://127.0.0.1:{port}"


def text_of(html: str, name: str) -> str:
    match = re.search(rf'data-testid="{name}"[^>]*>\s*(.*?)\s*<', html, re.S)
    assert match, f"no {name} on the page"
    return match.group(1)


def hidden(html: str, form: str) -> dict[str, str]:
    """The hidden fields of the page's form with that data-testid."""
    section = html[html.index(f'data-testid="{form}"'):]
    section = section[:section.index("</form>")]
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', section))
