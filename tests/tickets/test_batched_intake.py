"""ticket.observe applied in batches: each item fenced by its own token, versions of one issue
in lane order, an unchanged re-observe writing nothing."""

from __future__ import annotations

import json
from datetime import timedelta

from nexus_pipelines.connectors.core.values import ExternalIssue, source_version_digest
from nexus_pipelines.tickets.handlers import LOST
from nexus_pipelines.tickets.intake import CustodyKey, Observation, apply_observations
from nexus_pipelines.workqueue import claims
from nexus_pipelines.workqueue.handlers import Batched, Completed, HandlerRegistry
from nexus_pipelines.workqueue.worker import drain
from nexus_pipelines.local.worlds.gitlab import GitLabWorld
from nexus_pipelines.local.worlds.plant import NO_WAIT, Plant
from tests.connectors.support import counts


def _claimed(plant, key: str, issues: int):
    registration = plant.world.registration(key=key)
    plant.activate(registration)
    refs = plant.world.add_issues(issues)
    plant.poll([registration])
    plant.route()
    items: list = []
    with plant.pool.connection() as conn:
        while len(items) < issues:  # a claim takes at most its lock cap's share; claim the rest next
            taken = claims.claim_batch(conn, owner="batch-worker", limit=issues - len(items),
                                       lease_ttl=timedelta(seconds=30), registration_ids=[registration.registration_id])
            assert taken, f"{issues - len(items)} of {issues} items could not be claimed"
            items.extend(taken)
    return registration, refs, sorted(items, key=lambda i: i.work_id)


def _observation(item, **changes) -> Observation:
    """The item's issue version, or another version of the same issue with `changes`."""
    issue = ExternalIssue.model_validate_json(json.dumps({**item.payload["issue"], **changes}))
    tenant, _, key = item.registration_id.partition("/")
    return Observation(CustodyKey(tenant, key, issue.external_ref), project=item.payload["project"], issue=issue,
                       digest=source_version_digest(issue), labels=list(item.payload["labels"]),
                       work_id=item.work_id, work_token=item.token)


def _tickets(conn, registration):
    return conn.execute(
        """SELECT l.external_ref, t.title, t.version, t.updated_at FROM tickets t
             JOIN ticket_custody_links l USING (ticket_id)
            WHERE l.tenant = %s AND l.registration_key = %s ORDER BY l.external_ref""",
        (registration.tenant, registration.key)).fetchall()


def _routed(pool, key: str, issues: int):
    """A GitLab registration with `issues` issues, polled and routed: its work items wait to be drained."""
    plant = Plant(GitLabWorld(), pool)
    registration = plant.world.registration(key=key)
    plant.activate(registration)
    plant.world.add_issues(issues)
    plant.poll([registration])
    plant.route()
    return plant, registration

def test_a_lost_item_in_a_batch_writes_nothing_and_the_others_commit(pool):
    plant = Plant(GitLabWorld(), pool)
    registration, _, items = _claimed(plant, "batch-lost", 3)
    with pool.connection() as conn:
        conn.execute("UPDATE connector_work_items SET lease_until = now() - interval '1 second' WHERE work_id = %s",
                     (items[1].work_id,))
    assert plant.handlers.observe_batch(items) == [Completed("created"), LOST, Completed("created")]
    with pool.connection() as conn:
        linked = {r[0] for r in conn.execute(
            "SELECT external_ref FROM ticket_custody_links WHERE tenant = %s AND registration_key = %s",
            (registration.tenant, registration.key))}
        assert counts(conn, registration)["observations"] == 2
        states = dict(conn.execute("SELECT work_id, state || ':' || coalesce(outcome, '') FROM connector_work_items"
                                   " WHERE work_id = ANY(%s)", ([i.work_id for i in items],)).fetchall())
    assert [states[i.work_id] for i in items] == ["completed:created", "running:", "completed:created"]
    assert linked == {items[0].payload["issue"]["external_ref"], items[2].payload["issue"]["external_ref"]}


def test_a_batch_drained_with_one_item_lost_reports_it_lost_and_completes_the_others(pool):
    plant, registration = _routed(pool, "batch-drain-lost", issues=5)
    handlers = plant.handlers

    def losing_one(items):  # the lease of the first item of the batch ends before it is applied
        with pool.connection() as conn:
            conn.execute("UPDATE connector_work_items SET lease_until = now() - interval '1 second'"
                         " WHERE work_id = %s", (min(i.work_id for i in items),))
        return handlers.observe_batch(items)

    registry = HandlerRegistry({**handlers.as_dict(), "ticket.observe": Batched(losing_one)})
    report = drain(pool, registry, registration_ids=[registration.registration_id], retry_policy=NO_WAIT,
                   time_budget_s=30, concurrency=1, claim_batch=5, max_items=5)
    with pool.connection() as conn:
        assert counts(conn, registration)["tickets"] == report.completed
    assert report.lost >= 1 and report.completed >= 1
    assert report.lost + report.completed == report.claimed


def test_a_drained_batch_completes_its_items_in_the_transaction_that_writes_their_tickets(pool):
    plant, registration = _routed(pool, "batch-one-commit", issues=30)
    report = plant.drain([registration.registration_id])
    with pool.connection() as conn:
        writers = conn.execute(
            """SELECT w.xmin::text, l.xmin::text FROM ticket_custody_links l
                 JOIN connector_work_items w ON w.work_id = l.linked_by_work_id
                WHERE l.tenant = %s AND l.registration_key = %s AND w.state = 'completed'""",
            (registration.tenant, registration.key)).fetchall()
    assert len(writers) == 30 and all(item == link for item, link in writers)  # one transaction each
    assert (report.completed, report.lost) == (30, 0)


def test_two_versions_of_one_issue_in_one_batch_apply_in_lane_order(pool):
    plant = Plant(GitLabWorld(), pool)
    registration, _, (item,) = _claimed(plant, "batch-lanes", 1)
    first = _observation(item)
    later = first.issue.external_updated_at + timedelta(minutes=1)
    second = _observation(item, title="Second version", external_updated_at=later.isoformat())
    with pool.connection() as conn, conn.transaction():
        outcomes = [r.outcome for r in apply_observations(conn, [first, second])]
    assert outcomes == ["created", "updated"]
    with pool.connection() as conn:
        ((_, title, version, _),) = _tickets(conn, registration)
        assert counts(conn, registration)["observations"] == 2
    assert (title, version) == ("Second version", 2)


def test_an_older_version_after_a_newer_one_in_one_batch_is_kept_but_stale(pool):
    plant = Plant(GitLabWorld(), pool)
    registration, _, (item,) = _claimed(plant, "batch-stale", 1)
    newer = _observation(item, title="Newer",
                         external_updated_at=(_observation(item).issue.external_updated_at
                                              + timedelta(minutes=1)).isoformat())
    with pool.connection() as conn, conn.transaction():
        outcomes = [r.outcome for r in apply_observations(conn, [newer, _observation(item)])]
    assert outcomes == ["created", "stale"]
    with pool.connection() as conn:
        ((_, title, version, _),) = _tickets(conn, registration)
        assert counts(conn, registration)["observations"] == 2
    assert (title, version) == ("Newer", 1)


def test_an_unchanged_re_observe_in_a_batch_writes_nothing_beside_new_and_changed_issues(pool):
    plant = Plant(GitLabWorld(), pool)
    registration, _, items = _claimed(plant, "batch-unchanged", 3)
    with pool.connection() as conn, conn.transaction():
        apply_observations(conn, [_observation(i) for i in items[:2]])
    with pool.connection() as conn:
        before, tickets_before = counts(conn, registration), _tickets(conn, registration)
    changed = _observation(items[1], title="Changed")
    with pool.connection() as conn, conn.transaction():
        outcomes = [r.outcome for r in apply_observations(conn, [_observation(items[0]), changed,
                                                                 _observation(items[2])])]
    assert outcomes == ["unchanged", "updated", "created"]
    with pool.connection() as conn, conn.transaction():
        again = [r.outcome for r in apply_observations(conn, [_observation(items[0]), changed])]
    assert again == ["unchanged", "unchanged"]
    with pool.connection() as conn:
        after, tickets_after = counts(conn, registration), _tickets(conn, registration)
    assert after["tickets"] == before["tickets"] + 1
    assert after["observations"] == before["observations"] + 2
    assert tickets_after[0] == tickets_before[0]  # the unchanged issue: same title, version and updated_at
    assert tickets_after[1][1:3] == ("Changed", tickets_before[1][2] + 1)


def test_a_round_of_new_issues_is_applied_in_one_statement_and_known_ones_in_one_more(pool):
    from tests.workqueue.support import CountingConnection

    plant = Plant(GitLabWorld(), pool)
    registration, _, items = _claimed(plant, "batch-statements", 20)
    with pool.connection() as conn, conn.transaction():
        counting = CountingConnection(conn)
        first = apply_observations(counting, [_observation(i) for i in items[:10]])
    assert [r.outcome for r in first] == ["created"] * 10 and counting.statements == 1
    mixed = [_observation(i, title=f"edited {n}") if n % 2 else _observation(i) for n, i in enumerate(items[:10])]
    with pool.connection() as conn, conn.transaction():
        counting = CountingConnection(conn)
        second = apply_observations(counting, mixed + [_observation(i) for i in items[10:]])
    assert [r.outcome for r in second] == ["unchanged", "updated"] * 5 + ["created"] * 10
    assert [r.ticket_id for r in second[:10]] == [r.ticket_id for r in first]
    assert counting.statements == 2
    with pool.connection() as conn:
        assert counts(conn, registration)["observations"] == 25


def _tickets_seq_scans(one) -> int:
    """Sequential scans of `tickets` so far, those of the pool's one connection included."""
    with one.connection() as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")  # flushed when this statement ends
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return conn.execute("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'tickets'").fetchone()[0]


def test_a_first_sync_drained_after_tickets_was_analyzed_empty_checks_new_tickets_by_index(pool, control_dsn):
    """An ANALYZE (autovacuum's) of the still empty `tickets` table must not leave the drain's
    connection checking each new ticket's foreign keys with a scan of the whole table, as a
    generic plan cached while the table was empty does once the sync has grown it."""
    from nexus_pipelines.connectors.registry import REGISTRY
    from nexus_pipelines.control.db import make_pool
    from nexus_pipelines.local.worlds.plant import executor

    plant = Plant(GitLabWorld(), pool)
    _, _, items = _claimed(plant, "analyzed-empty", 1500)
    one = make_pool(control_dsn, max_size=1)  # every batch on the connection that caches the plans
    try:
        handlers = type(plant.handlers)(one, REGISTRY, plant.composer, executor_factory=executor)
        with one.connection() as conn:
            conn.execute("ANALYZE tickets")
        for start in range(0, 1400, 100):
            assert set(handlers.observe_batch(items[start:start + 100])) == {Completed("created")}
        before = _tickets_seq_scans(one)
        assert set(handlers.observe_batch(items[1400:])) == {Completed("created")}
        assert _tickets_seq_scans(one) - before == 0
    finally:
        one.close()


def _stored(conn, registration):
    return conn.execute(
        """SELECT t.title, t.description, t.labels, t.source_state, t.source_updated_at, t.source_digest,
                  l.connector_kind, l.display_url,
                  (SELECT o.issue FROM ticket_observations o WHERE o.ticket_id = t.ticket_id
                    ORDER BY o.observation_id DESC LIMIT 1)
             FROM tickets t JOIN ticket_custody_links l USING (ticket_id)
            WHERE l.tenant = %s AND l.registration_key = %s""",
        (registration.tenant, registration.key)).fetchone()


def _expected(observation: Observation) -> tuple:
    issue = observation.issue
    return (issue.title, issue.description, observation.labels, issue.external_state, issue.external_updated_at,
            observation.digest, issue.connector_kind, issue.display_url, issue.model_dump(mode="json"))


def test_a_ticket_and_its_observation_hold_the_fields_of_the_version_exactly_when_created_and_updated(pool):
    plant = Plant(GitLabWorld(), pool)
    registration, _, (item,) = _claimed(plant, "batch-fields", 1)
    text = {"title": 'Überweisung "fällig" \\ 東京', "description": "line one\nline\ttwo \\u0041 \U0001F600"}
    created = _observation(item, **text, external_updated_at="2026-03-01T12:30:45.123456+02:00")
    updated = _observation(item, title="Zweite Fassung ✓", description="", external_state="closed",
                           external_updated_at="2026-03-01T11:00:00.5-00:30")
    with pool.connection() as conn, conn.transaction():
        assert apply_observations(conn, [created])[0].outcome == "created"
    with pool.connection() as conn:
        assert _stored(conn, registration) == _expected(created)
    with pool.connection() as conn, conn.transaction():
        assert apply_observations(conn, [updated])[0].outcome == "updated"
    with pool.connection() as conn:
        assert _stored(conn, registration) == _expected(updated)
