"""The shared real-Postgres acceptance for every connector (the admission contract of
docs/design/connector-contract.md): the provider's simulator
behind an in-process transport, the real control plane, and the code location's own
poll, routing, work-queue drain and ticket handlers.

A provider binds it with `from tests.connectors.conformance.acceptance import *` and a
`make_world` fixture returning a factory of fresh, independent worlds.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from nexus_pipelines.connectors.core import store
from nexus_pipelines.connectors.core.activation import ActivationRefused
from nexus_pipelines.connectors.core.tick import run_tick
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.tickets.proofs import ProofRefused
from nexus_pipelines.workqueue.dlq import replay
from nexus_pipelines.local.worlds.plant import Plant, executor
from tests.connectors.support import counts, expired_claim, tickets_by_ref


@pytest.fixture
def world(make_world):
    return make_world()


@pytest.fixture
def plant(world, pool):
    return Plant(world, pool)


def _key(request) -> str:
    return "acc-" + str(abs(hash(request.node.name)) % 10**8)


def _registered(plant, request, **kw):
    registration = plant.world.registration(key=kw.pop("key", _key(request)), **kw)
    plant.activate(registration)
    return registration


def test_round_trip_issue_ticket_update_proof_close_and_replay_changes_nothing(plant, pool, request):
    world = plant.world
    registration = _registered(plant, request)
    refs = world.add_issues(5)
    plant.sync([registration])
    with pool.connection() as conn:
        tickets = tickets_by_ref(conn, registration)
        assert set(tickets) == set(refs)
        assert {(t["triage_state"], t["priority"], t["observations"]) for t in tickets.values()} == {("UNTRIAGED",
                                                                                                     "P2", 1)}
    world.update_issue(refs[1], title="Updated at the source")
    plant.sync([registration])
    with pool.connection() as conn:
        updated = tickets_by_ref(conn, registration)[refs[1]]
        assert (updated["title"], updated["version"], updated["observations"]) == ("Updated at the source", 2, 2)
    proof = plant.prove(updated["ticket_id"])
    plant.drain([registration.registration_id])
    assert world.issue_state(refs[1]) == "closed"
    marked = [c for c in world.comments(refs[1]) if "[nexus:close:" in c]
    assert len(marked) == 1 and proof.command_id.removeprefix("close-") in marked[0]
    with pool.connection() as conn:
        before = counts(conn, registration)
    assert before["tickets"] == 5 and before["receipts"] == 1 and before["commands"] == 1
    # replay everything: re-poll (the close itself changed the issue), re-prove, re-drain
    plant.sync([registration])
    plant.sync([registration])
    again = plant.prove(updated["ticket_id"])
    plant.drain([registration.registration_id])
    with pool.connection() as conn:
        after = counts(conn, registration)
    assert again.command_id == proof.command_id and not again.created
    assert (after["tickets"], after["commands"], after["receipts"]) == (5, 1, 1)
    assert after["observations"] == before["observations"] + 1  # the close-back's own update, observed once
    assert len([c for c in world.comments(refs[1]) if "[nexus:close:" in c]) == 1


def test_an_unchanged_repoll_writes_nothing(plant, pool, request):
    registration = _registered(plant, request)
    plant.world.add_issues(12)
    plant.sync([registration])
    with pool.connection() as conn:
        before = counts(conn, registration)
    report = plant.sync([registration])
    with pool.connection() as conn:
        assert counts(conn, registration) == before
    assert report.totals["admitted"] == 0


def test_restart_mid_scan_resumes_from_the_durable_cursor(plant, pool, request):
    registration = _registered(plant, request, page_size=4)
    refs = plant.world.add_issues(10)
    assert plant.poll([registration], max_ticks=1).totals["pages"] == 1  # the poller "dies" after one page
    restarted = Plant(plant.world, pool)  # a new process: nothing but the database survives
    restarted.sync([registration])
    with pool.connection() as conn:
        assert set(tickets_by_ref(conn, registration)) == set(refs)
        assert counts(conn, registration)["observations"] == 10


def test_a_stale_poll_fence_writes_nothing(plant, pool, request):
    registration = _registered(plant, request)
    plant.world.add_issues(3)
    with pool.connection() as conn:
        store.request_poll(conn, [registration.registration_id])
        stale = expired_claim(conn, registration)
        report = run_tick(conn, REGISTRY, plant.composer, owner="fresh", executor=executor(),
                          registration_ids=[registration.registration_id])
        assert report.outcome == "page" and report.issues == 3
        with pytest.raises(store.PollLeaseLost):
            store.commit_page(conn, stale, [], next_cursor="stale-cursor", exhausted=True)
        (cursor,) = conn.execute("SELECT cursor_token FROM connector_progress WHERE registration_key = %s",
                                 (registration.key,)).fetchone()
    assert cursor == report.cursor


def test_overlapping_polls_create_nothing_twice(plant, pool, request):
    registration = _registered(plant, request, page_size=5)
    refs = plant.world.add_issues(40)
    with pool.connection() as conn:
        store.request_poll(conn, [registration.registration_id])
    threads = [threading.Thread(target=plant.poll, args=([registration],), kwargs={"owner": f"p{n}"})
               for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    plant.sync([registration])
    with pool.connection() as conn:
        tickets = tickets_by_ref(conn, registration)
        assert set(tickets) == set(refs) and counts(conn, registration)["observations"] == 40


def test_a_long_throttle_ends_the_tick_and_the_schedule_waits_for_it(plant, pool, request):
    registration = _registered(plant, request)
    plant.world.add_issues(2)
    plant.world.fail_next("list", "throttled_long")
    report = plant.poll([registration])
    assert report.totals["failures"] == 1 and report.ticks[0].retry_in_s >= 3600
    with pool.connection() as conn:
        cursor, wait = conn.execute(
            "SELECT cursor_token, extract(epoch FROM next_poll_at - now()) FROM connector_progress"
            " WHERE registration_key = %s", (registration.key,)).fetchone()
    assert cursor is None and wait >= 3590


def test_a_terminal_poll_failure_is_recorded_and_backs_off(plant, pool, request):
    registration = _registered(plant, request)
    plant.world.fail_next("list", "authentication")
    report = plant.poll([registration])
    assert report.ticks[0].failure_class == "terminal" and report.ticks[0].failure.startswith("authentication")
    with pool.connection() as conn:
        (view,) = store.progress(conn, [registration.registration_id])
    assert view.failure_count == 1 and view.last_failure.startswith("authentication")


def _close_setup(plant, pool, request):
    registration = _registered(plant, request)
    (ref,) = plant.world.add_issues(1)
    plant.sync([registration])
    with pool.connection() as conn:
        ticket = tickets_by_ref(conn, registration)[ref]["ticket_id"]
    return registration, ref, ticket


def _writes(world, operation):
    return sum(1 for op, _ in world.requests() if op == operation)


def _marked(world, ref):
    return [c for c in world.comments(ref) if "[nexus:close:" in c]


def test_an_ambiguous_close_whose_marker_is_found_stores_one_receipt(plant, pool, request):
    registration, ref, ticket = _close_setup(plant, pool, request)
    plant.world.fail_next("comment", "apply_then_timeout")
    plant.prove(ticket)
    plant.drain([registration.registration_id])
    assert len(_marked(plant.world, ref)) == 1 and plant.world.issue_state(ref) == "closed"
    with pool.connection() as conn:
        assert counts(conn, registration)["receipts"] == 1


def test_an_ambiguous_close_confirmed_absent_is_written_once_more(plant, pool, request):
    registration, ref, ticket = _close_setup(plant, pool, request)
    plant.world.fail_next("comment", "timeout")
    plant.prove(ticket)
    plant.drain([registration.registration_id])
    assert len(_marked(plant.world, ref)) == 1 and plant.world.issue_state(ref) == "closed"


@pytest.mark.parametrize("step, read", [("comment", "lookup"), ("close", "read_issue")])
def test_one_failed_reconciliation_read_is_read_again_and_the_close_completes(plant, pool, request, step, read):
    registration, ref, ticket = _close_setup(plant, pool, request)
    plant.world.fail_next(step, "apply_then_5xx")
    plant.world.fail_next(read, "provider_5xx")
    plant.prove(ticket)
    report = plant.drain([registration.registration_id])
    assert (report.dead, report.retried) == (0, 0)
    assert len(_marked(plant.world, ref)) == 1 and plant.world.issue_state(ref) == "closed"
    with pool.connection() as conn:
        assert counts(conn, registration)["receipts"] == 1


def _close_work(conn, command_id):
    return conn.execute(
        """SELECT c.status, w.work_id, w.state, w.attempts FROM ticket_close_commands c
             JOIN connector_outbox_events e ON e.idempotency_key = c.command_id
             JOIN connector_work_items w ON w.event_id = e.event_id
            WHERE c.command_id = %s""", (command_id,)).fetchone()


def test_an_inconclusive_close_is_retried_later_and_reconciles_before_it_writes_again(plant, pool, request):
    registration, ref, ticket = _close_setup(plant, pool, request)
    plant.world.fail_next("comment", "apply_then_timeout")
    plant.world.fail_next("lookup", "provider_5xx", times=3)  # every read of the first invocation
    plant.prove(ticket)
    report = plant.drain([registration.registration_id])
    assert report.dead == 0 and report.retried >= 1
    assert len(_marked(plant.world, ref)) == 1 and plant.world.issue_state(ref) == "closed"
    assert _writes(plant.world, "comment") == 1  # the retry found the marker: no second write
    with pool.connection() as conn:
        assert counts(conn, registration)["receipts"] == 1


def test_a_close_inconclusive_on_every_attempt_is_dead_lettered_and_its_replay_reconciles_first(plant, pool,
                                                                                                 request):
    registration, ref, ticket = _close_setup(plant, pool, request)
    plant.world.fail_next("comment", "apply_then_timeout")
    plant.world.fail_next("lookup", "provider_5xx", times=10_000)
    proof = plant.prove(ticket)
    report = plant.drain([registration.registration_id])
    assert report.dead == 1 and plant.world.issue_state(ref) == "open"
    assert _writes(plant.world, "comment") == 1
    with pool.connection() as conn:
        status, work_id, state, attempts = _close_work(conn, proof.command_id)
        assert state == "dead" and attempts > 1 and status in ("ambiguous", "dispatched")
        plant.world.clear_faults()
        replay(conn, work_id, requested_by="operator:test")
    plant.drain([registration.registration_id])
    assert len(_marked(plant.world, ref)) == 1 and plant.world.issue_state(ref) == "closed"
    with pool.connection() as conn:
        assert counts(conn, registration)["receipts"] == 1


def test_a_throttled_close_is_retried_by_the_queue_no_sooner_than_the_provider_asks(plant, pool, request):
    registration, ref, ticket = _close_setup(plant, pool, request)
    plant.world.fail_next("comment", "throttled_long")
    plant.prove(ticket)
    report = plant.drain([registration.registration_id])
    assert report.retried == 1 and plant.world.comments(ref) == []
    with pool.connection() as conn:
        (wait,) = conn.execute(
            """SELECT extract(epoch FROM run_after - now()) FROM connector_work_items
                WHERE registration_id = %s AND work_type = 'issue.close'""",
            (registration.registration_id,)).fetchone()
    assert wait > 3500


def test_a_wait_a_poll_met_holds_close_back_and_the_held_close_spends_no_attempt(plant, pool, request):
    registration, ref, ticket = _close_setup(plant, pool, request)
    plant.world.fail_next("list", "throttled_long")
    plant.world.add_issues(1)
    assert plant.poll([registration]).totals["failures"] == 1
    plant.prove(ticket)
    plant.world.clear_requests()
    report = plant.drain([registration.registration_id])
    assert plant.world.requests() == [] and report.retried == 1  # the provider's gate held every request
    with pool.connection() as conn:
        state, counted, wait = conn.execute(
            """SELECT state, attempts - unstarted_attempts, extract(epoch FROM run_after - now())
                 FROM connector_work_items WHERE registration_id = %s AND work_type = 'issue.close'""",
            (registration.registration_id,)).fetchone()
    assert (state, counted) == ("retry", 0) and wait > 3500


def test_only_an_eligible_ticket_takes_a_success_proof(plant, pool, request):
    registration, ref, ticket = _close_setup(plant, pool, request)
    with pool.connection() as conn:
        with pytest.raises(ProofRefused, match="does not exist"):
            plant.prove(10**9)
        (orphan,) = conn.execute(
            "INSERT INTO tickets (tenant, project, title, description, source_state, source_updated_at, source_digest)"
            " VALUES ('acme', 'p', 'manual', '', 'open', now(), 'sha256:x') RETURNING ticket_id").fetchone()
        with pytest.raises(ProofRefused, match="no connector source"):
            plant.prove(orphan)
        conn.execute("UPDATE tickets SET status = 'cancelled' WHERE ticket_id = %s", (ticket,))
        with pytest.raises(ProofRefused, match="cancelled"):
            plant.prove(ticket)
        conn.execute("UPDATE tickets SET status = 'open' WHERE ticket_id = %s", (ticket,))
    first = plant.prove(ticket, "req-a")
    assert plant.prove(ticket, "req-a") == first.__class__(first.proof_id, first.command_id, ticket, created=False)
    with pytest.raises(ProofRefused, match="other evidence"):
        plant.prove(ticket, "req-a", evidence="something else")
    with pytest.raises(ProofRefused, match="already has accepted success proof"):
        plant.prove(ticket, "req-b")
    with pool.connection() as conn:
        assert counts(conn, registration)["commands"] == 1


def test_two_active_registrations_are_isolated(make_world, pool, request):
    plants = [Plant(make_world(), pool) for _ in range(2)]
    registrations = [p.world.registration(key=f"{_key(request)}-{n}") for n, p in enumerate(plants)]
    for plant, registration in zip(plants, registrations):
        plant.activate(registration)
        plant.world.add_issues(3)
        plant.sync([registration])
    a, b = registrations
    with pool.connection() as conn:
        snapshot_b = counts(conn, b), store.progress(conn, [b.registration_id])
        revisions = {r.registration_id: (r.revision_id, r.revision_no) for r in store.progress(conn)}
    assert a.digest != b.digest and revisions[a.registration_id] != revisions[b.registration_id]
    # advance, fence, replay and close A: none of B's facts move
    plants[0].world.add_issues(2)
    plants[0].sync([a])
    with pool.connection() as conn:
        ticket_a = next(iter(tickets_by_ref(conn, a).values()))["ticket_id"]
    plants[0].prove(ticket_a)
    plants[0].drain([a.registration_id])
    with pool.connection() as conn:
        assert (counts(conn, b), store.progress(conn, [b.registration_id])) == snapshot_b
        snapshot_a = counts(conn, a), store.progress(conn, [a.registration_id])
        tickets_a, tickets_b = tickets_by_ref(conn, a), tickets_by_ref(conn, b)
    assert not set(tickets_a) & set(tickets_b)
    assert {t["ticket_id"] for t in tickets_a.values()}.isdisjoint(t["ticket_id"] for t in tickets_b.values())
    # and the other direction
    plants[1].world.add_issues(1)
    plants[1].sync([b])
    with pool.connection() as conn:
        ticket_b = next(iter(tickets_by_ref(conn, b).values()))["ticket_id"]
    plants[1].prove(ticket_b)
    plants[1].drain([b.registration_id])
    with pool.connection() as conn:
        assert (counts(conn, a), store.progress(conn, [a.registration_id])) == snapshot_a
        assert counts(conn, b)["receipts"] == 1 and counts(conn, a)["receipts"] == 1
        leases = conn.execute(
            "SELECT registration_key, lease_token FROM connector_progress WHERE registration_key = ANY(%s)",
            ([a.key, b.key],)).fetchall()
    assert len(leases) == 2


def test_a_new_revision_drains_the_old_generation_and_takes_over_from_its_own_cursor(plant, pool, request):
    key = _key(request)
    old = plant.world.registration(key=key, page_size=3)
    plant.activate(old)
    refs = plant.world.add_issues(7)
    plant.poll([old])  # polled but not yet routed or drained: the old generation holds open work
    new = plant.world.registration(key=key, page_size=5)  # an edited file: a new revision
    assert new.revision_id != old.revision_id
    result = plant.activate(new)
    assert result.retired == (old.revision_id,) and result.revision_no == 2
    with pool.connection() as conn:
        views = {v.revision_id: v for v in store.progress(conn, [new.registration_id])}
        assert views[new.revision_id].cursor is None and views[new.revision_id].status == "active"
        assert views[old.revision_id].status == "retired"
        gens = dict(conn.execute("SELECT revision, status FROM workqueue_generations WHERE registration_id = %s",
                                 (new.registration_id,)).fetchall())
        assert gens == {1: "quiesced", 2: "active"}
    plant.sync([new])  # the new revision re-reads everything from its own cursor
    with pool.connection() as conn:
        tickets = tickets_by_ref(conn, new)
        assert set(tickets) == set(refs) and counts(conn, new)["observations"] == 7  # custody dedup: nothing twice


def test_activation_waits_while_the_old_revision_is_polling(plant, pool, request):
    key = _key(request)
    old = plant.world.registration(key=key)
    plant.activate(old)
    with pool.connection() as conn:
        store.request_poll(conn, [old.registration_id])
        store.claim_due(conn, REGISTRY, owner="busy", ttl=timedelta(seconds=60),
                        registration_ids=[old.registration_id])
    with pytest.raises(ActivationRefused, match="is polling right now"):
        plant.activate(plant.world.registration(key=key, page_size=7))


__all__ = [name for name in dir() if name.startswith("test_")] + ["world", "plant"]
