"""Every gap a reconciliation sweep re-observes is an Attention finding for the project's
commander, whatever the ticket's triage state or status; triage of an untriaged ticket or the
commander's acknowledgement resolves it, and a gap found after the commander read the ticket
stays waiting."""

from __future__ import annotations

import uuid

import pytest

from nexus_pipelines.actors.store import memberships
from nexus_pipelines.local.worlds.gitlab import PROJECT_ID, GitLabWorld
from nexus_pipelines.local.worlds.plant import Plant, accept, member
from nexus_pipelines.tickets.authority import CommandRefused, NotAuthorized
from nexus_pipelines.tickets.board import attention_items
from tests.tickets.support import acknowledge, ingest, sweep_gap, triage

_worlds = iter(range(PROJECT_ID + 6000, PROJECT_ID + 7000))


@pytest.fixture
def project(pool):
    name = f"gap-{uuid.uuid4().hex[:6]}"
    plant = Plant(GitLabWorld(project_id=next(_worlds)), pool)
    registration, ids = ingest(plant, name, 3)
    with pool.connection() as conn:
        commander, _ = member(conn, f"acme/{name}", "commander")
        operator, _ = member(conn, f"acme/{name}", "operator")
    return plant, registration, ids, commander, operator


def _waiting(conn, principal) -> list[tuple[int, str, str]]:
    return [(i.ticket_id, i.kind, i.resolved_by) for i in attention_items(conn, memberships(conn, principal))]


def test_a_gap_on_an_accepted_ticket_waits_on_attention_until_its_commander_acknowledges_it(project, pool):
    plant, registration, (ticket, *_), commander, operator = project
    with pool.connection() as conn:
        accept(conn, ticket)
    finding = sweep_gap(plant, registration, ticket)

    with pool.connection() as conn:
        assert (ticket, "connector_sweep_gap", "the commander's acknowledgement") in _waiting(conn, commander)
        with pytest.raises(NotAuthorized, match="acknowledge needs commander"):
            acknowledge(conn, operator, ticket, finding)
        result = acknowledge(conn, commander, ticket, finding)
        assert (result.triage_state, result.status) == ("ACCEPTED", "open")
        assert all(t != ticket for t, _, _ in _waiting(conn, commander))
        (disposition,) = conn.execute("SELECT disposition FROM attention_resolutions WHERE finding_id = %s",
                                      (finding,)).fetchone()
    assert disposition == "ACKNOWLEDGED"


def test_a_gap_on_a_cancelled_ticket_is_a_finding_its_commander_can_acknowledge(project, pool):
    plant, registration, (_, ticket, _), commander, _ = project
    with pool.connection() as conn:
        triage(conn, commander, ticket, "REJECTED", reason="not a defect")
    finding = sweep_gap(plant, registration, ticket)

    with pool.connection() as conn:
        assert (ticket, "connector_sweep_gap", "the commander's acknowledgement") in _waiting(conn, commander)
        assert acknowledge(conn, commander, ticket, finding).status == "cancelled"
        assert all(t != ticket for t, _, _ in _waiting(conn, commander))


def test_a_gap_on_an_untriaged_ticket_is_resolved_by_its_triage(project, pool):
    plant, registration, (*_, ticket), commander, _ = project
    sweep_gap(plant, registration, ticket)
    with pool.connection() as conn:
        waiting = [w for w in _waiting(conn, commander) if w[0] == ticket]
        assert waiting == [(ticket, "connector_triage_required", "the commander's triage"),
                           (ticket, "connector_sweep_gap", "the commander's triage or acknowledgement")]
        triage(conn, commander, ticket, "REJECTED", reason="spam")
        assert all(t != ticket for t, _, _ in _waiting(conn, commander))


def test_a_second_gap_is_a_second_finding_and_stays_waiting_past_an_acknowledgement_of_the_first(project, pool):
    plant, registration, (ticket, *_), commander, _ = project
    with pool.connection() as conn:
        accept(conn, ticket)
    first = sweep_gap(plant, registration, ticket)
    second = sweep_gap(plant, registration, ticket, renamed="Renamed while the scans looked away")
    assert second > first

    with pool.connection() as conn:
        acknowledge(conn, commander, ticket, first)  # what the commander had read
        assert [w for w in _waiting(conn, commander) if w[0] == ticket] == [
            (ticket, "connector_sweep_gap", "the commander's acknowledgement")]
        acknowledge(conn, commander, ticket, second)
        assert all(t != ticket for t, _, _ in _waiting(conn, commander))


def test_acknowledging_a_ticket_with_no_waiting_gap_is_refused_in_one_line(project, pool):
    _, _, (ticket, *_), commander, _ = project
    with pool.connection() as conn, pytest.raises(CommandRefused, match="no unresolved sweep-gap finding") as refused:
        acknowledge(conn, commander, ticket, 1)
    assert "\n" not in str(refused.value)
