"""The ticket work types: fenced by the work item's token, strict about their payloads."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import pytest

from nexus_pipelines.workqueue import claims
from nexus_pipelines.workqueue.handlers import PermanentError
from nexus_pipelines.local.worlds.gitlab import GitLabWorld
from nexus_pipelines.local.worlds.plant import Plant
from tests.connectors.support import counts


def _claimed_observation(plant, pool, key):
    registration = plant.world.registration(key=key)
    plant.activate(registration)
    plant.world.add_issues(1)
    plant.poll([registration])
    plant.route()
    with pool.connection() as conn:
        (item,) = claims.claim_batch(conn, owner="slow-worker", limit=1, lease_ttl=timedelta(seconds=30),
                                     registration_ids=[registration.registration_id])
    return registration, item


def test_a_holder_whose_lease_expired_writes_no_ticket(pool):
    plant = Plant(GitLabWorld(), pool)
    registration, item = _claimed_observation(plant, pool, "fence-expired")
    with pool.connection() as conn:
        conn.execute("UPDATE connector_work_items SET lease_until = now() - interval '1 second' WHERE work_id = %s",
                     (item.work_id,))
    assert plant.handlers.observe(item) == "lease_lost"
    with pool.connection() as conn:
        assert counts(conn, registration)["tickets"] == 0


def test_a_holder_whose_item_was_reclaimed_writes_no_ticket_and_the_new_holder_does(pool):
    plant = Plant(GitLabWorld(), pool)
    registration, stale = _claimed_observation(plant, pool, "fence-reclaimed")
    with pool.connection() as conn:
        conn.execute("UPDATE connector_work_items SET lease_until = now() - interval '1 second' WHERE work_id = %s",
                     (stale.work_id,))
        claims.reclaim_expired(conn)
        conn.execute("UPDATE connector_work_items SET run_after = now() WHERE work_id = %s", (stale.work_id,))
        (fresh,) = claims.claim_batch(conn, owner="new-worker", limit=1, lease_ttl=timedelta(seconds=30),
                                      registration_ids=[registration.registration_id])
    assert fresh.token > stale.token
    assert plant.handlers.observe(stale) == "lease_lost"
    assert plant.handlers.observe(fresh) == "created"
    with pool.connection() as conn:
        assert counts(conn, registration)["tickets"] == 1


def _refusal(plant, item, **changes) -> str:
    """What the observe handler refuses a copy of `item` with `changes` for."""
    with pytest.raises(PermanentError) as refused:
        plant.handlers.observe(dataclasses.replace(item, **changes))
    return str(refused.value)


def test_an_observation_whose_issue_does_not_match_its_digest_creates_nothing(pool):
    plant = Plant(GitLabWorld(), pool)
    registration, item = _claimed_observation(plant, pool, "digest-mismatch")
    tampered = dict(item.payload)
    tampered["issue"] = {**tampered["issue"], "title": "changed after the digest was taken"}
    assert "does not match its source digest" in _refusal(plant, item, payload_json=json.dumps(tampered))
    broken = '{"issue": {"title": 1}, "digest": "x"}'
    assert "carries no valid issue" in _refusal(plant, item, payload_json=broken)
    with pool.connection() as conn:
        assert counts(conn, registration)["tickets"] == 0


def test_an_observation_on_a_lane_that_is_not_its_issue_creates_nothing(pool):
    plant = Plant(GitLabWorld(), pool)
    registration, item = _claimed_observation(plant, pool, "lane-mismatch")
    assert "its source lane is not the issue it carries" in _refusal(plant, item, source_lane_key="gitlab:1:999")
    with pool.connection() as conn:
        assert counts(conn, registration)["tickets"] == 0


def test_an_observation_receipt_that_names_no_issue_in_its_correlation_fails_alone(pool):
    plant = Plant(GitLabWorld(), pool)
    registration = plant.world.registration(key="no-correlation")
    plant.activate(registration)
    plant.world.add_issues(2)
    plant.poll([registration])
    with pool.connection() as conn:
        (bare,) = conn.execute(
            """UPDATE ingress_receipts SET correlation = correlation - 'external_ref'
                WHERE receipt_id = (SELECT min(receipt_id) FROM ingress_receipts WHERE registration_id = %s)
            RETURNING receipt_id""", (registration.registration_id,)).fetchone()
    plant.route()
    with pool.connection() as conn:
        rows = dict(conn.execute(
            "SELECT receipt_id, routing_status || ': ' || coalesce(routing_error, '') FROM ingress_receipts"
            " WHERE registration_id = %s", (registration.registration_id,)).fetchall())
    assert rows.pop(bare) == "failed: RoutingRejected: an observation receipt names no external_ref in its correlation"
    assert list(rows.values()) == ["materialized: "]


def test_an_issue_closed_at_the_source_changes_no_ticket_authority_and_closes_nothing(pool):
    """Provider input carries no authority: a source close is an observation only."""
    plant = Plant(GitLabWorld(), pool)
    registration = plant.world.registration(key="closed-at-source")
    plant.activate(registration)
    (ref,) = plant.world.add_issues(1)
    plant.sync([registration])
    plant.world.state.update_issue(plant.world.project_id, plant.world._iid(ref), state="closed")
    plant.world.state.clock.advance(1)
    plant.sync([registration])
    with pool.connection() as conn:
        row = conn.execute(
            """SELECT t.status, t.triage_state, t.priority, t.source_state,
                      (SELECT count(*) FROM ticket_close_commands c WHERE c.ticket_id = t.ticket_id),
                      (SELECT count(*) FROM ticket_observations o WHERE o.ticket_id = t.ticket_id)
                 FROM tickets t JOIN ticket_custody_links l USING (ticket_id)
                WHERE l.tenant = %s AND l.registration_key = %s""",
            (registration.tenant, registration.key)).fetchone()
    assert row == ("open", "UNTRIAGED", "P2", "closed", 0, 2)
