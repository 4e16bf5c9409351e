"""A project with real ingested GitLab tickets and its actors, for the page tests."""

from __future__ import annotations

import itertools
import re
import uuid
from dataclasses import dataclass

from nexus_pipelines.local.worlds.gitlab import PROJECT_ID, GitLabWorld
from nexus_pipelines.local.worlds.plant import Plant
from nexus_pipelines.local.worlds.plant import member
from tests.tickets.support import ingest

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


def text_of(html: str, name: str) -> str:
    match = re.search(rf'data-testid="{name}"[^>]*>\s*(.*?)\s*<', html, re.S)
    assert match, f"no {name} on the page"
    return match.group(1)


def hidden(html: str, form: str) -> dict[str, str]:
    """The hidden fields of the page's form with that data-testid."""
    section = html[html.index(f'data-testid="{form}"'):]
    section = section[:section.index("</form>")]
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', section))
