"""Triage acceptance (docs/design/triage-authority.md) on real ingested items: intake through the code location's
own poll, routing, drain and ticket handlers against a provider world, then triage and
priority through the two commands with actors authenticated by their credentials.

A provider binds it with `from tests.tickets.triage_acceptance import *` and a
`make_world` fixture returning a factory of fresh worlds (the `World` protocol of
tests/connectors/conformance/harness.py).
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace

import pytest

from nexus_pipelines.tickets import board, projection
from nexus_pipelines.tickets.authority import CommandRefused, NotAuthorized
from nexus_pipelines.tickets.commands import VersionConflict, set_connector_ticket_priority, triage_connector_ticket
from nexus_pipelines.tickets.proofs import ProofRefused, record_proof
from nexus_pipelines.tickets.queries import ticket_detail
from nexus_pipelines.actors.store import memberships, revoke
from nexus_pipelines.workqueue.dlq import replay
from nexus_pipelines.local.worlds.plant import Plant
from tests.connectors.support import counts
from nexus_pipelines.local.worlds.plant import member
from tests.tickets.support import ingest, set_priority, triage, version


@pytest.fixture
def plant(make_world, pool):
    return Plant(make_world(), pool)


def _ingest(plant: Plant, project: str, issues: int = 2):
    return ingest(plant, project, issues)


def _ref(conn, ticket_id):
    return conn.execute("SELECT external_ref FROM ticket_custody_links WHERE ticket_id = %s",
                        (ticket_id,)).fetchone()[0]


def _project() -> str:
    return f"proj-{uuid.uuid4().hex[:8]}"


def _state(conn, ticket_id):
    return conn.execute("SELECT triage_state, priority, status, version FROM tickets WHERE ticket_id = %s",
                        (ticket_id,)).fetchone()


def _unresolved(conn, ticket_id):
    return conn.execute(
        """SELECT count(*) FROM attention_findings f WHERE ticket_id = %s AND kind = 'connector_triage_required'
              AND owner_role = 'commander'
              AND NOT EXISTS (SELECT 1 FROM attention_resolutions r WHERE r.finding_id = f.finding_id)""",
        (ticket_id,)).fetchone()[0]


def _close_commands(conn, ticket_id):
    return conn.execute("SELECT count(*) FROM ticket_close_commands WHERE ticket_id = %s", (ticket_id,)).fetchone()[0]


def test_ingested_items_appear_untriaged_at_p2_with_one_unresolved_commander_finding(plant, pool):
    registration, ids = _ingest(plant, _project(), issues=3)
    plant.sync([registration])  # an unchanged re-poll adds no second finding
    with pool.connection() as conn:
        for ticket_id in ids:
            assert _state(conn, ticket_id)[:3] == ("UNTRIAGED", "P2", "open")
            assert _unresolved(conn, ticket_id) == 1
            (facts,) = conn.execute("SELECT count(*) FROM attention_findings WHERE ticket_id = %s",
                                    (ticket_id,)).fetchone()
            assert facts == 1


def test_intake_is_atomic_a_failing_finding_leaves_no_ticket(plant, pool):
    project = _project()
    with pool.connection() as conn:
        conn.execute(f"""CREATE FUNCTION refuse_{project.replace('-', '_')}() RETURNS trigger LANGUAGE plpgsql AS $$
                         BEGIN IF NEW.project = '{project}' THEN RAISE EXCEPTION 'finding refused'; END IF;
                         RETURN NEW; END $$""")
        conn.execute(f"""CREATE TRIGGER refuse_finding BEFORE INSERT ON attention_findings FOR EACH ROW
                         EXECUTE FUNCTION refuse_{project.replace('-', '_')}()""")
    try:
        registration, ids = _ingest(plant, project, issues=1)
        assert ids == []  # the ticket, custody and facts rolled back with the finding
        with pool.connection() as conn:
            assert counts(conn, registration)["priority_facts"] == 0
    finally:
        with pool.connection() as conn:
            conn.execute("DROP TRIGGER refuse_finding ON attention_findings")
    with pool.connection() as conn:
        (work_id, state) = conn.execute("SELECT work_id, state FROM connector_work_items WHERE registration_id = %s",
                                        (registration.registration_id,)).fetchone()
        assert state == "dead"  # every attempt rolled back whole; an operator replays it
        replay(conn, work_id, requested_by="operator:test")
    plant.drain([registration.registration_id])
    with pool.connection() as conn:
        (ticket_id,) = [r[0] for r in conn.execute(
            "SELECT ticket_id FROM ticket_custody_links WHERE registration_key = %s", (registration.key,))]
        assert _unresolved(conn, ticket_id) == 1 and _state(conn, ticket_id)[0] == "UNTRIAGED"


def test_a_commander_accepts_after_an_operator_priority_and_the_trail_records_both(plant, pool):
    project = _project()
    registration, (ticket, _) = _ingest(plant, project)
    with pool.connection() as conn:
        commander, _ = member(conn, f"acme/{project}", "commander", name=f"cmd-{project}")
        operator, _ = member(conn, f"acme/{project}", "operator", name=f"op-{project}")
        set_priority(conn, operator, ticket, "P1", reason="blocks the release")
        accepted = triage(conn, commander, ticket, "ACCEPTED", reason="confirmed defect")
        assert (accepted.triage_state, accepted.priority, accepted.status, accepted.replayed) == (
            "ACCEPTED", "P1", "open", False)
        assert _unresolved(conn, ticket) == 0
        trail = ticket_detail(conn, ticket)["trail"]
    assert [(f["kind"], f["value"], f["prior"], f["actor"], f["actor_role"]) for f in trail] == [
        ("priority", "P2", None, "system:intake", None),
        ("triage", "UNTRIAGED", None, "system:intake", None),
        ("priority", "P1", "P2", f"op-{project}", "operator"),
        ("triage", "ACCEPTED", None, f"cmd-{project}", "commander"),
    ]
    assert [f["reason"] for f in trail[2:]] == ["blocks the release", "confirmed defect"]
    plant.prove(ticket)  # ordinary execution: the accepted ticket takes a proof and closes its issue
    plant.drain([registration.registration_id])
    with pool.connection() as conn:
        assert counts(conn, registration)["receipts"] == 1


def test_acceptance_needs_an_actor_priority_not_the_automatic_p2(plant, pool):
    project = _project()
    _, (ticket, _) = _ingest(plant, project)
    with pool.connection() as conn:
        commander, _ = member(conn, f"acme/{project}", "commander")
        with pytest.raises(CommandRefused, match="only the automatic P2 from intake"):
            triage(conn, commander, ticket, "ACCEPTED")
        set_priority(conn, commander, ticket, "P2", reason="P2 is right")  # the same value, now a decision
        assert triage(conn, commander, ticket, "ACCEPTED").triage_state == "ACCEPTED"
        with pytest.raises(CommandRefused, match="already ACCEPTED"):
            triage(conn, commander, ticket, "REJECTED")


def test_setting_the_priority_an_actor_already_set_is_an_unchanged_reply_that_records_nothing(plant, pool):
    project = _project()
    _, (ticket, _) = _ingest(plant, project)
    with pool.connection() as conn:
        commander, _ = member(conn, f"acme/{project}", "commander")
        first = set_priority(conn, commander, ticket, "P1", reason="customer impact")
        again = set_priority(conn, commander, ticket, "P1", reason="still customer impact")
        assert (again.unchanged, again.replayed, again.command_seq, again.version, again.priority) == (
            True, False, None, first.version, "P1")
        facts = conn.execute("SELECT prior_priority, priority FROM ticket_priority_facts WHERE ticket_id = %s"
                             " ORDER BY fact_id", (ticket,)).fetchall()
        assert facts == [(None, "P2"), ("P2", "P1")]  # intake's, then the one decision; no P1->P1
        assert _state(conn, ticket)[3] == first.version
        assert set_priority(conn, commander, ticket, "P3").unchanged is False  # a change is still recorded


def test_duplicate_appends_one_same_project_relation_cancels_and_never_closes(plant, make_world, pool):
    project = _project()
    registration, (dup, canonical) = _ingest(plant, project)
    _, (elsewhere,) = _ingest(Plant(make_world(), pool), _project(), issues=1)
    with pool.connection() as conn:
        commander, _ = member(conn, f"acme/{project}", "commander")
        with pytest.raises(CommandRefused, match="names its canonical ticket"):
            triage(conn, commander, dup, "DUPLICATE")
        with pytest.raises(CommandRefused, match="belongs to another project"):
            triage(conn, commander, dup, "DUPLICATE", canonical=elsewhere)
        with pytest.raises(CommandRefused, match="cannot duplicate itself"):
            triage(conn, commander, dup, "DUPLICATE", canonical=dup)
        result = triage(conn, commander, dup, "DUPLICATE", canonical=canonical, reason="same crash")
        assert (result.triage_state, result.status) == ("DUPLICATE", "cancelled")
        relations = conn.execute("SELECT relation, related_ticket_id FROM ticket_relations WHERE ticket_id = %s",
                                 (dup,)).fetchall()
        assert relations == [("duplicates", canonical)] and _unresolved(conn, dup) == 0
        with pytest.raises(CommandRefused, match="is cancelled; priority is set on open tickets only"):
            set_priority(conn, commander, dup)
    with pytest.raises(ProofRefused, match="cancelled"):
        plant.prove(dup)
    plant.sync([registration])
    with pool.connection() as conn:
        assert _close_commands(conn, dup) == 0
        assert plant.world.issue_state(_ref(conn, dup)) == "open" and not plant.world.comments(_ref(conn, dup))


def test_reject_records_the_reason_cancels_and_never_closes(plant, pool):
    project = _project()
    registration, (ticket, _) = _ingest(plant, project)
    with pool.connection() as conn:
        commander, _ = member(conn, f"acme/{project}", "commander")
        with pytest.raises(CommandRefused, match="reason is needed"):
            triage(conn, commander, ticket, "REJECTED", reason="   ")
        result = triage(conn, commander, ticket, "REJECTED", reason="works as designed")
        assert (result.triage_state, result.status) == ("REJECTED", "cancelled")
        assert conn.execute("SELECT reason, actor_role FROM ticket_triage_facts WHERE ticket_id = %s"
                            " AND triage_state = 'REJECTED'", (ticket,)).fetchone() == ("works as designed",
                                                                                          "commander")
        assert conn.execute("SELECT count(*) FROM ticket_relations WHERE ticket_id = %s", (ticket,)).fetchone() == (0,)
        with pytest.raises(ProofRefused, match="cancelled"):
            record_proof(conn, ticket, evidence="shipped", recorded_by="ops", client_request_id="r")
    plant.drain([registration.registration_id])
    with pool.connection() as conn:
        assert _close_commands(conn, ticket) == 0 and plant.world.issue_state(_ref(conn, ticket)) == "open"


def test_an_untriaged_ticket_takes_no_success_proof(plant, pool):
    _, (ticket, _) = _ingest(plant, _project())
    with pool.connection() as conn:
        with pytest.raises(ProofRefused, match="is UNTRIAGED; only a ticket its project commander ACCEPTED"):
            record_proof(conn, ticket, evidence="shipped", recorded_by="ops", client_request_id="early")
        assert _close_commands(conn, ticket) == 0


def test_an_operator_sets_priority_but_cannot_triage(plant, pool):
    project = _project()
    _, (ticket, _) = _ingest(plant, project)
    with pool.connection() as conn:
        operator, _ = member(conn, f"acme/{project}", "operator")
        assert set_priority(conn, operator, ticket, "P0").priority == "P0"
        with pytest.raises(NotAuthorized, match="is operator of project .*; triage needs commander"):
            triage(conn, operator, ticket, "REJECTED")
        assert _state(conn, ticket)[:2] == ("UNTRIAGED", "P0") and _unresolved(conn, ticket) == 1


def test_unauthorized_cross_project_revoked_and_stale_requests_fail_and_write_nothing(plant, make_world, pool):
    project, other = _project(), _project()
    _, (ticket, _) = _ingest(plant, project)
    _ingest(Plant(make_world(), pool), other, issues=1)
    with pool.connection() as conn:
        outsider, _ = member(conn, f"acme/{project}", None)
        other_commander, _ = member(conn, f"acme/{other}", "commander")
        commander, _ = member(conn, f"acme/{project}", "commander")
        before = _state(conn, ticket), counts_of_facts(conn, ticket)
        with pytest.raises(NotAuthorized, match="has no role on the ticket's project") as refused:
            set_priority(conn, outsider, ticket)
        assert project not in str(refused.value)  # nor which project that is
        with pytest.raises(NotAuthorized, match="has no role on the ticket's project"):
            triage(conn, other_commander, ticket, "REJECTED")  # a commander, of another project
        with pytest.raises(VersionConflict, match=r"is at version \d+, not \d+"):
            set_connector_ticket_priority(conn, commander, client_command_id=uuid.uuid4().hex, ticket_id=ticket,
                                          expected_version=version(conn, ticket) + 1, priority="P1", reason="x")
        revoke(conn, commander.actor_id, f"acme/{project}", revoked_by="test")
        with pytest.raises(NotAuthorized):
            triage(conn, commander, ticket, "REJECTED")
        assert (_state(conn, ticket), counts_of_facts(conn, ticket)) == before


def counts_of_facts(conn, ticket_id):
    return conn.execute(
        """SELECT (SELECT count(*) FROM ticket_priority_facts WHERE ticket_id = %(t)s),
                  (SELECT count(*) FROM ticket_triage_facts WHERE ticket_id = %(t)s),
                  (SELECT count(*) FROM ticket_commands WHERE ticket_id = %(t)s),
                  (SELECT count(*) FROM attention_resolutions r JOIN attention_findings f USING (finding_id)
                    WHERE f.ticket_id = %(t)s)""", {"t": ticket_id}).fetchone()


def test_a_command_id_replays_its_result_and_refuses_other_arguments(plant, pool):
    project = _project()
    _, (ticket, other) = _ingest(plant, project)
    with pool.connection() as conn:
        commander, _ = member(conn, f"acme/{project}", "commander")
        operator, _ = member(conn, f"acme/{project}", "operator")
        first = set_priority(conn, commander, ticket, "P1", command_id="cmd-1")
        facts = counts_of_facts(conn, ticket)
        again = set_connector_ticket_priority(conn, commander, client_command_id="cmd-1", ticket_id=ticket,
                                              expected_version=first.version - 1, priority="P1",
                                              reason="customer impact")
        assert again == first.__class__(**{**first.__dict__, "replayed": True})
        assert counts_of_facts(conn, ticket) == facts
        for changed in ({"priority": "P3"}, {"reason": "another reason"}, {"ticket_id": other},
                        {"expected_version": first.version}):
            args = {"client_command_id": "cmd-1", "ticket_id": ticket, "expected_version": first.version - 1,
                    "priority": "P1", "reason": "customer impact", **changed}
            with pytest.raises(CommandRefused, match="already used for a different command"):
                set_connector_ticket_priority(conn, commander, **args)
        with pytest.raises(CommandRefused, match="already used for a different command"):  # another actor
            set_connector_ticket_priority(conn, operator, client_command_id="cmd-1", ticket_id=ticket,
                                          expected_version=first.version - 1, priority="P1", reason="customer impact")
        with pytest.raises(CommandRefused, match="already used for a different command"):  # another command
            triage_connector_ticket(conn, commander, client_command_id="cmd-1", ticket_id=ticket,
                                    expected_version=first.version, disposition="ACCEPTED", reason="ok")
        assert counts_of_facts(conn, ticket) == facts


def test_concurrent_commands_on_one_ticket_one_wins_the_other_conflicts(plant, pool):
    project = _project()
    _, (ticket, _) = _ingest(plant, project)
    with pool.connection() as conn:
        actors = [member(conn, f"acme/{project}", role)[0] for role in ("commander", "operator")]
        seen = version(conn, ticket)
    barrier, outcomes = threading.Barrier(2), []

    def decide(principal, priority):
        with pool.connection() as conn:
            barrier.wait()
            try:
                outcomes.append(set_connector_ticket_priority(
                    conn, principal, client_command_id=uuid.uuid4().hex, ticket_id=ticket, expected_version=seen,
                    priority=priority, reason="race").priority)
            except VersionConflict as exc:
                outcomes.append(exc)

    threads = [threading.Thread(target=decide, args=(p, prio)) for p, prio in zip(actors, ("P0", "P4"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [o for o in outcomes if isinstance(o, str)]
    assert len(winners) == 1 and len(outcomes) == 2 and isinstance(next(o for o in outcomes if o not in winners),
                                                                    VersionConflict)
    with pool.connection() as conn:
        assert _state(conn, ticket)[1:] == (winners[0], "open", seen + 1)
        assert counts_of_facts(conn, ticket)[0] == 2  # the automatic P2 and the winner


def test_projection_rebuild_restores_board_detail_and_attention(plant, pool):
    project = _project()
    _, ids = _ingest(plant, project, issues=4)
    with pool.connection() as conn:
        commander, _ = member(conn, f"acme/{project}", "commander")
        set_priority(conn, commander, ids[0], "P1")
        triage(conn, commander, ids[0], "ACCEPTED")
        triage(conn, commander, ids[1], "DUPLICATE", canonical=ids[0])
        triage(conn, commander, ids[2], "REJECTED", reason="spam")
        scope = memberships(conn, commander)

        def views():
            return (*_ageless(board.project_counts(conn, scope), board.board_lanes(conn, scope),
                              board.attention_items(conn, scope)),
                    [ticket_detail(conn, t)["triage_state"] for t in ids])

        before = views()
        assert before[0][0].untriaged == 1 and before[0][0].cancelled == 2
        assert [item.ticket_id for item in before[2]] == [ids[3]]
        conn.execute("UPDATE tickets SET triage_state = 'UNTRIAGED', priority = 'P4', status = 'open'"
                     " WHERE ticket_id = ANY(%s)", (ids,))  # a lost projection
        assert views() != before
        assert projection.rebuild(conn) >= len(ids)  # other tickets of the module's database are other tests'
        assert views() == before and projection.rebuild(conn) == 0


def _ageless(counts, lanes, attention):
    """The Board's and Attention's views without their ages: an age is the database clock's reading at the query
    (rounded to the second), so two reads of unchanged rows differ once a rounding boundary falls between them."""
    return ([replace(c, oldest_finding_age_s=None) for c in counts],
            {state: replace(lane, cards=[replace(card, age_s=None) for card in lane.cards])
             for state, lane in lanes.items()},
            [replace(item, age_s=None) for item in attention])
