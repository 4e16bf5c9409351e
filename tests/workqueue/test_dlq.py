from __future__ import annotations

from datetime import timedelta

import pytest

from nexus_pipelines.workqueue import claims
from nexus_pipelines.workqueue.dlq import ReplayRefused, list_dead, replay
from nexus_pipelines.workqueue.generations import activate, quiesce, record_drained
from nexus_pipelines.workqueue.retry import sanitize_summary
from nexus_pipelines.local.worlds.tokens import gitlab_token

from .conftest import enqueue, items

TTL = timedelta(seconds=30)


def kill_one(conn, reg):
    (item,) = claims.claim_batch(conn, owner="w", limit=1, lease_ttl=TTL, registration_ids=[reg])
    claims.fail(conn, item, "Rejected", "remote said no (api_key=sk_live_123456)")
    return item


def test_dlq_lists_dead_items_with_event_and_receipt_context(control_conn, reg):
    enqueue(control_conn, reg, items(2))
    dead = kill_one(control_conn, reg)
    (row,) = list_dead(control_conn, registration_id=reg)
    assert row.work_id == dead.work_id and row.event_id == dead.event_id
    assert row.route_id == "bulk" and row.namespace == "bulk" and row.failure_class == "Rejected"
    assert "sk_live_123456" not in row.failure_summary


def test_replay_is_a_new_attempt_of_the_same_item(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    dead = kill_one(control_conn, reg)
    result = replay(control_conn, dead.work_id, requested_by="op")
    assert result.replays == 1
    (again,) = claims.claim_batch(control_conn, owner="w", limit=5, lease_ttl=TTL, registration_ids=[reg])
    assert again.work_id == dead.work_id and again.attempts == 1 and again.token > dead.token
    assert claims.complete(control_conn, [again.fence]) == {again.work_id}
    assert list_dead(control_conn, registration_id=reg) == []
    (audit,) = control_conn.execute("SELECT count(*) FROM workqueue_replays WHERE work_id = %s", (dead.work_id,)).fetchone()
    assert audit == 1


def test_replay_refuses_items_that_are_not_dead(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    (item,) = control_conn.execute("SELECT work_id FROM connector_work_items WHERE registration_id = %s", (reg,)).fetchone()
    with pytest.raises(ReplayRefused, match="only dead"):
        replay(control_conn, item, requested_by="op")
    with pytest.raises(ReplayRefused, match="does not exist"):
        replay(control_conn, 10**12, requested_by="op")


def test_replay_fails_closed_when_the_generation_is_not_active(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    dead = kill_one(control_conn, reg)
    quiesce(control_conn, reg, 1, recorded_by="op")
    record_drained(control_conn, reg, 1, recorded_by="op")
    activate(control_conn, reg, 2, recorded_by="op", route_versions={"bulk": 1})
    with pytest.raises(ReplayRefused, match="quiesced"):
        replay(control_conn, dead.work_id, requested_by="op")
    assert control_conn.execute("SELECT state FROM connector_work_items WHERE work_id = %s", (dead.work_id,)).fetchone() == ("dead",)


def test_replay_fails_closed_when_the_route_version_is_not_bound(control_conn, reg):
    from nexus_pipelines.workqueue.receipts import enqueue_work_items

    enqueue_work_items(control_conn, items(1), registration_id=reg, revision=1)
    activate(control_conn, reg, 1, recorded_by="op", route_versions={"bulk": 2})  # the event has version 1
    dead = kill_one(control_conn, reg)
    with pytest.raises(ReplayRefused, match="route"):
        replay(control_conn, dead.work_id, requested_by="op")


def test_replay_refuses_dead_items_of_a_generation_the_event_path_owns(control_conn, reg):
    from .support import roll_back

    enqueue(control_conn, reg, items(2))
    dead = kill_one(control_conn, reg)
    roll_back(control_conn, reg)  # the other item is fenced; the dead one stays as it was
    with pytest.raises(ReplayRefused, match="on the Event path"):
        replay(control_conn, dead.work_id, requested_by="op")
    assert list_dead(control_conn, registration_id=reg) == []  # the Event path is this generation's DLQ now


@pytest.mark.parametrize(
    "raw, leaked",
    [
        ("GET https://user:s3cretpass@api.example.com/x failed", "s3cretpass"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc", "eyJhbGci"),
        ('{"client_secret": "abc-def-ghi"}', "abc-def-ghi"),
        # a documented token shape, built at run time so no literal in the tree looks leaked
        (f"key {gitlab_token('0123456789abcdefghij0123')} rejected", "0123456789abcdefghij0123"),
    ],
)
def test_sanitize_summary_strips_secrets(raw, leaked):
    assert leaked not in sanitize_summary(raw)


def test_sanitize_summary_truncates_to_one_line():
    out = sanitize_summary("a\nb\t" + "word " * 500)
    assert "\n" not in out and len(out) <= 500
