"""A stored revision this code can no longer read (a schema id or validation change in a
new release) fails on its own durable schedule instead of ending the poll run."""

from nexus_pipelines.connectors.core import store
from nexus_pipelines.connectors.core.tick import poll
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.local.worlds.gitlab import GitLabWorld
from nexus_pipelines.local.worlds.plant import Plant, executor


def test_an_unreadable_stored_revision_fails_terminally_and_the_run_polls_the_others(pool):
    plant = Plant(GitLabWorld(), pool)
    stale, healthy = (plant.world.registration(key=key) for key in ("schema-bumped", "still-readable"))
    for registration in (stale, healthy):
        plant.activate(registration)
    plant.world.add_issues(3)
    with pool.connection() as conn, conn.transaction():
        # as an older release wrote it (the revision is immutable, so past its guard trigger)
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute("""UPDATE connector_registrations
                           SET config = jsonb_set(config, '{schema_id}', '"nexus.connectors.gitlab.v0"')
                         WHERE registration_key = %s""", (stale.key,))
    with pool.connection() as conn:
        store.request_poll(conn, [stale.registration_id, healthy.registration_id])
        report = poll(conn, REGISTRY, plant.composer, owner="poller", executor=executor(),
                      registration_ids=[stale.registration_id, healthy.registration_id])
        rows = {key: rest for key, *rest in conn.execute(
            """SELECT registration_key, lease_owner, failure_count, last_failure_class, last_failure_reason,
                      next_poll_at > now() + interval '30 seconds'
                 FROM connector_progress WHERE registration_key IN (%s, %s)""",
            (stale.key, healthy.key)).fetchall()}
    failed = [t for t in report.ticks if t.registration_id == stale.registration_id]
    assert [t.outcome for t in failed] == ["failure"]
    assert failed[0].failure.startswith("registration_unreadable: ") and failed[0].failure_class == "terminal"
    assert report.stopped == "idle"
    assert rows[stale.key] == [None, 1, "terminal", "registration_unreadable", True]  # lease released, backed off
    polled = [t for t in report.ticks if t.registration_id == healthy.registration_id]
    assert sum(t.issues for t in polled) == 3
