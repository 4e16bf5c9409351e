"""A fresh Jira API token never appears in logs, control tables, cursor tokens, failure text or
results, through success, an echoing 5xx and revocation; and the Jira fixtures, examples and
docs hold credential references only."""

from __future__ import annotations

import base64
import logging
import re

import yaml

from nexus_pipelines.connectors.core.registration import load_registration
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.local.simulators.http import Fault
from nexus_pipelines.redaction import looks_like_secret
from nexus_pipelines.settings import PROJECT_ROOT
from nexus_pipelines.local.worlds.jira import EMAIL, JiraWorld
from nexus_pipelines.local.worlds.plant import Plant
from tests.connectors.support import everything_recorded, tickets_by_ref

# Atlassian API tokens start ATATT3 and run to ~190 characters; basic credentials are base64.
_TOKEN_SHAPES = (re.compile(r"ATATT3[A-Za-z0-9_=-]{20,}"), re.compile(r"\bBasic\s+[A-Za-z0-9+/]{16,}={0,2}"))
_SCANNED = ("README.md", "docs/connectors/authoring.md", "configs/connectors/examples/jira.yaml",
            "configs/connectors/local/demo-jira.yaml", "nexus_pipelines/local/worlds/jira.py")


def test_no_jira_token_leaves_the_adapter(pool, caplog):
    caplog.set_level(logging.DEBUG)
    world = JiraWorld(project_id=31337)  # a token no other test has seen
    plant = Plant(world, pool)
    registration = world.registration(key="jira-canary")
    plant.activate(registration)
    for n in range(3):
        world.state.add_issue(world.cloud_id, world.project_id, summary=f"canary {n}")
    reports = [plant.sync([registration])]
    with pool.connection() as conn:
        ticket = next(iter(tickets_by_ref(conn, registration).values()))["ticket_id"]
    plant.prove(ticket, evidence=f"evidence quoting token={world.token} and Authorization: Basic {world.token}")
    world.state.faults.push("add_comment", Fault(status=500, body={"errorMessages": [f"echo {world.token}"]}))
    plant.drain([registration.registration_id])
    world.state.revoke(world.token)
    reports.append(plant.sync([registration]))
    haystack = everything_recorded(plant, registration, reports, caplog.text)
    assert "canary 0" in haystack and "authentication" in haystack  # the scan and the failure were recorded
    credential = base64.b64encode(f"{EMAIL}:{world.token}".encode()).decode()
    assert [s for s in (world.token, credential, world.token[-40:]) if s in haystack] == []


def test_jira_registrations_examples_and_docs_hold_references_only():
    jira_files = sorted((PROJECT_ROOT / "configs").rglob("*jira*.yaml"))
    assert len(jira_files) >= 2  # the example and the demo registration
    for path in jira_files:
        registration = load_registration(path, REGISTRY)  # refuses literals that look like secrets
        assert re.match(r"^(env|file):", registration.provider.token), path
        strings = [v for v in _strings(yaml.safe_load(path.read_text()))]
        assert [s for s in strings if looks_like_secret(s)] == [], path
    scanned = [PROJECT_ROOT / name for name in _SCANNED] + sorted((PROJECT_ROOT / "tests/connectors/jira").glob("*.py"))
    for path in scanned:
        text = path.read_text()
        assert [m.group(0)[:12] for shape in _TOKEN_SHAPES for m in shape.finditer(text)] == [], path


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
