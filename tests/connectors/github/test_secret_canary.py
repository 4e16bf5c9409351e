"""The App private key, the App JWTs and every installation token never appear in logs, control
tables, cursor tokens, failure text or results, through success, failure and revocation."""

from __future__ import annotations

import logging

from nexus_pipelines.local.simulators.http import Fault
from nexus_pipelines.local.worlds.github import INSTALLATION_ID, GitHubWorld
from nexus_pipelines.local.worlds.github_keys import new_key_pair
from nexus_pipelines.local.worlds.plant import Plant
from tests.connectors.support import everything_recorded, tickets_by_ref


def test_no_github_credential_leaves_the_adapter(pool, caplog):
    caplog.set_level(logging.DEBUG)
    world = GitHubWorld(repository_id=31337, key_pair=new_key_pair())  # a key no other test has seen
    plant = Plant(world, pool)
    registration = world.registration(key="gh-canary")
    plant.activate(registration)
    for n in range(3):
        world.state.add_issue(world.repository_id, title=f"canary {n}")
    reports = [plant.sync([registration])]
    (token,) = world.state.tokens
    with pool.connection() as conn:
        ticket = next(iter(tickets_by_ref(conn, registration).values()))["ticket_id"]
    plant.prove(ticket, evidence=f"evidence quoting token={token} and Authorization: Bearer {token}")
    world.state.faults.push("create_comment", Fault(status=500, body={"message": f"echo {token}"}))
    plant.drain([registration.registration_id])
    world.state.revoke_tokens(INSTALLATION_ID)
    world.state.installations[INSTALLATION_ID].suspended = True  # and the re-mint fails closed
    reports.append(plant.sync([registration]))
    jwts = [r.headers["Authorization"].removeprefix("Bearer ") for r in world.transport.requests
            if r.url.path.endswith("/access_tokens")]
    haystack = everything_recorded(plant, registration, reports, caplog.text)
    assert "canary 0" in haystack and "authentication" in haystack  # the scan and the failure were recorded
    key_body = "".join(world.private_key.splitlines()[1:-1])
    secrets = [*world.state.tokens, *jwts, key_body[:64], key_body[-64:]]
    assert len(world.state.tokens) >= 1 and jwts
    assert [s for s in secrets if s in haystack] == []
