from __future__ import annotations

from datetime import timedelta

import pytest

from nexus_pipelines.workqueue import claims
from nexus_pipelines.workqueue.generations import (
    GenerationGateError,
    activate,
    drain_status,
    quiesce,
    record_drained,
)

from .conftest import enqueue, items

TTL = timedelta(seconds=30)


def claim(conn, reg, n=100):
    return claims.claim_batch(conn, owner="w", limit=n, lease_ttl=TTL, registration_ids=[reg])


def test_items_are_not_claimable_before_a_durable_activation_receipt(control_conn, reg):
    enqueue(control_conn, reg, items(3), activate_it=False)
    assert claim(control_conn, reg) == []
    receipt = activate(control_conn, reg, 1, recorded_by="op", route_versions={"bulk": 1})
    row = control_conn.execute(
        "SELECT kind, proof->'route_versions' FROM workqueue_generation_receipts WHERE receipt_id = %s",
        (receipt.receipt_id,),
    ).fetchone()
    assert row == ("activation", {"bulk": 1})
    assert len(claim(control_conn, reg)) == 3
    # activation is idempotent for an active generation
    assert activate(control_conn, reg, 1, recorded_by="op", route_versions={"bulk": 1}).receipt_id == receipt.receipt_id


def test_quiesce_stops_claims_and_reports_lease_drain(control_conn, reg):
    enqueue(control_conn, reg, items(4))
    held = claim(control_conn, reg, 2)
    status = quiesce(control_conn, reg, 1, recorded_by="op")
    assert status.status == "quiescing" and status.active_leases == 2 and not status.drained
    assert claim(control_conn, reg) == []  # the two pending items are no longer claimable
    with pytest.raises(GenerationGateError, match="still holds 2 active"):
        record_drained(control_conn, reg, 1, recorded_by="op")
    # in-flight items may still finish under their leases
    assert claims.complete(control_conn, [i.fence for i in held]) == {i.work_id for i in held}
    assert drain_status(control_conn, reg, 1).drained
    proof = record_drained(control_conn, reg, 1, recorded_by="op")
    assert proof.kind == "drained" and proof.proof["active_leases"] == 0
    assert drain_status(control_conn, reg, 1).status == "quiesced"


def test_expired_leases_block_the_drain_proof_until_reclaimed(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    claim(control_conn, reg)
    quiesce(control_conn, reg, 1, recorded_by="op")
    control_conn.execute(
        "UPDATE connector_work_items SET lease_until = now() - interval '1 second' WHERE registration_id = %s", (reg,)
    )
    status = drain_status(control_conn, reg, 1)
    assert (status.active_leases, status.expired_leases) == (0, 1)
    with pytest.raises(GenerationGateError):
        record_drained(control_conn, reg, 1, recorded_by="op")
    claims.reclaim_expired(control_conn)
    record_drained(control_conn, reg, 1, recorded_by="op")


def test_ambiguous_ownership_fails_closed(control_conn, reg):
    enqueue(control_conn, reg, items(1))  # revision 1 active
    with pytest.raises(GenerationGateError, match="revision 1 .* still active"):
        activate(control_conn, reg, 2, recorded_by="op", route_versions={})
    claim(control_conn, reg)
    quiesce(control_conn, reg, 1, recorded_by="op")
    with pytest.raises(GenerationGateError, match="without a drain proof"):
        activate(control_conn, reg, 2, recorded_by="op", route_versions={})
    control_conn.execute("UPDATE connector_work_items SET state = 'completed', lease_until = NULL WHERE registration_id = %s", (reg,))
    record_drained(control_conn, reg, 1, recorded_by="op")
    activate(control_conn, reg, 2, recorded_by="op", route_versions={})
    quiesce(control_conn, reg, 2, recorded_by="op")
    record_drained(control_conn, reg, 2, recorded_by="op")
    # a generation the Event path runs is never activated on the WorkItem path while it runs
    activate(control_conn, reg, 3, recorded_by="op", route_versions={}, claim_path="event")
    with pytest.raises(GenerationGateError, match="active on the event path"):
        activate(control_conn, reg, 3, recorded_by="op", route_versions={})
    with pytest.raises(GenerationGateError, match="never activated"):
        quiesce(control_conn, reg, 9, recorded_by="op")


def test_database_allows_one_active_generation_per_registration(control_conn, reg):
    import psycopg

    activate(control_conn, reg, 1, recorded_by="op", route_versions={})
    with pytest.raises(psycopg.errors.UniqueViolation):
        control_conn.execute(
            "INSERT INTO workqueue_generations (registration_id, revision, status) VALUES (%s, 2, 'active')", (reg,)
        )


def test_generation_receipts_are_immutable(control_conn, reg):
    import psycopg

    activate(control_conn, reg, 1, recorded_by="op", route_versions={})
    with pytest.raises(psycopg.errors.IntegrityConstraintViolation):
        control_conn.execute(
            "UPDATE workqueue_generation_receipts SET recorded_by = 'x' WHERE registration_id = %s", (reg,)
        )


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM workqueue_generation_receipts WHERE registration_id = %(reg)s",
        "DELETE FROM connector_outbox_events WHERE registration_id = %(reg)s"
        " AND NOT EXISTS (SELECT 1 FROM connector_work_items w WHERE w.event_id = connector_outbox_events.event_id)",
        "TRUNCATE workqueue_generation_receipts CASCADE",
    ],
)
def test_generation_receipts_and_events_cannot_be_deleted(control_conn, reg, statement):
    import psycopg

    enqueue(control_conn, reg, items(1))
    # an event without work items (so no foreign key stands in the way of its delete)
    control_conn.execute(
        """INSERT INTO connector_outbox_events (receipt_id, registration_id, revision, route_id, route_version,
                                                source_kind, source_id, idempotency_key, delivery_seq, payload_hash)
           SELECT receipt_id, registration_id, revision, 'bulk', 1, 'k', 'i', 'no-work', 0, 'h'
             FROM connector_outbox_events WHERE registration_id = %s LIMIT 1""",
        (reg,),
    )
    with pytest.raises(psycopg.errors.IntegrityConstraintViolation):
        control_conn.execute(statement, {"reg": reg})
    (receipts,) = control_conn.execute(
        "SELECT count(*) FROM workqueue_generation_receipts WHERE registration_id = %s", (reg,)
    ).fetchone()
    assert receipts == 1


def test_caller_proof_cannot_override_the_verified_activation_proof(control_conn, reg):
    enqueue(control_conn, reg, items(1))
    quiesce(control_conn, reg, 1, recorded_by="op")
    control_conn.execute(
        "UPDATE connector_work_items SET state = 'completed', lease_until = NULL WHERE registration_id = %s", (reg,)
    )
    record_drained(control_conn, reg, 1, recorded_by="op")
    receipt = activate(
        control_conn, reg, 2, recorded_by="op", route_versions={"bulk": 2},
        proof={"ticket": "OPS-1", "claim_schema": "forged", "other_revisions": {}, "route_versions": {"bulk": 9}},
    )
    proof = control_conn.execute(
        "SELECT proof FROM workqueue_generation_receipts WHERE receipt_id = %s", (receipt.receipt_id,)
    ).fetchone()[0]
    assert proof["ticket"] == "OPS-1"
    assert proof["claim_schema"] != "forged"
    assert proof["other_revisions"] == {"1": {"status": "quiesced", "claim_path": "work_item", "leases": 0}}
    assert proof["route_versions"] == {"bulk": 2}
    (bound,) = control_conn.execute(
        "SELECT route_versions FROM workqueue_generations WHERE registration_id = %s AND revision = 2", (reg,)
    ).fetchone()
    assert bound == {"bulk": 2}
