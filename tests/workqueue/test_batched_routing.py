"""A claimed batch of receipts is materialized in one transaction with set-based statements;
each receipt is still fenced by its own token and fails alone."""

from datetime import datetime, timezone

from nexus_pipelines.control.db import connect
from nexus_pipelines.workqueue.receipts import (
    EventSpec,
    ReceiptIn,
    Route,
    RoutingRejected,
    WorkSpec,
    admit_receipts,
    route_receipts,
)
from nexus_pipelines.workqueue.retry import RetryPolicy

from .support import CountingConnection

FAST = RetryPolicy(base_s=0, cap_s=0, jitter=0)


def _admit(conn, reg: str, n: int, route_key: str = "issues") -> None:
    admit_receipts(conn, [
        ReceiptIn(registration_id=reg, revision=1, namespace="poll", delivery_id=f"d{i}", route_key=route_key,
                  received_at=datetime.now(timezone.utc), body={"issue": f"I-{i}"})
        for i in range(n)])


def _events(receipt) -> list[EventSpec]:
    issue = receipt.body["issue"]
    return [EventSpec("issue", issue, f"observe:{issue}", payload=receipt.body,
                      work=[WorkSpec("ticket.observe", source_lane_key=issue, target_lane_key=f"t:{issue}"),
                            WorkSpec("audit.note", queue_class="bulk")])]


def _routes(materialize=_events) -> dict[str, Route]:
    return {"issues": Route("issues", 1, materialize)}


def _state(conn, reg: str) -> dict[str, tuple]:
    """Each delivery's routing status and how many events and work items it has."""
    return {r[0]: (r[1], r[2], r[3]) for r in conn.execute(
        """SELECT r.delivery_id, r.routing_status,
                  (SELECT count(*) FROM connector_outbox_events e WHERE e.receipt_id = r.receipt_id),
                  (SELECT count(*) FROM connector_work_items w JOIN connector_outbox_events e USING (event_id)
                    WHERE e.receipt_id = r.receipt_id)
             FROM ingress_receipts r WHERE r.registration_id = %s""", (reg,))}


def test_a_batch_of_many_receipts_is_routed_in_as_many_statements_as_a_batch_of_one(control_conn, reg):
    def statements(registration: str, n: int) -> int:
        _admit(control_conn, registration, n)
        counting = CountingConnection(control_conn)
        report = route_receipts(counting, _routes(), owner="router", limit=500)
        assert report.materialized == n, report
        return counting.statements

    one, many = statements(f"{reg}-one", 1), statements(f"{reg}-many", 60)
    assert many == one
    assert one <= 8, one  # the claim's plan setting, claim, hold, events, event ids, generations, work items, mark


def test_a_receipt_whose_lease_was_lost_changes_nothing_and_the_others_commit(control_conn, control_dsn, reg):
    _admit(control_conn, reg, 3)

    def steal_d1(receipt):
        if receipt.delivery_id == "d1":  # another router takes it over while this one works
            with connect(control_dsn) as other:
                other.execute("UPDATE ingress_receipts SET router_token = nextval('workqueue_tokens'),"
                              " router_owner = 'other' WHERE receipt_id = %s", (receipt.receipt_id,))
        return _events(receipt)

    report = route_receipts(control_conn, _routes(steal_d1), owner="router", limit=500)
    assert (report.materialized, report.lost) == (2, 1)
    assert _state(control_conn, reg) == {"d0": ("materialized", 1, 2), "d1": ("routing", 0, 0),
                                         "d2": ("materialized", 1, 2)}


def test_a_failing_route_is_recorded_on_its_receipt_alone_and_the_others_commit(control_conn, reg):
    _admit(control_conn, reg, 4)

    def some_fail(receipt):
        if receipt.delivery_id == "d1":
            raise RuntimeError("the parser broke")
        if receipt.delivery_id == "d2":
            raise RoutingRejected("not an issue")
        return _events(receipt)

    report = route_receipts(control_conn, _routes(some_fail), owner="router", limit=500)
    assert (report.materialized, report.retried, report.failed, report.lost) == (2, 1, 1, 0)
    assert _state(control_conn, reg) == {"d0": ("materialized", 1, 2), "d1": ("pending", 0, 0),
                                         "d2": ("failed", 0, 0), "d3": ("materialized", 1, 2)}


def test_a_receipt_whose_rows_the_database_refuses_fails_alone_and_the_others_commit(control_conn, reg):
    _admit(control_conn, reg, 3)

    def unstorable_d1(receipt):
        events = _events(receipt)
        if receipt.delivery_id == "d1":  # jsonb refuses a NUL character: the batch's insert fails
            return [EventSpec("issue", "I-1", "observe:I-1", payload={"title": "a\u0000b"}, work=events[0].work)]
        return events

    report = route_receipts(control_conn, _routes(unstorable_d1), owner="router", limit=500, policy=FAST)
    assert (report.materialized, report.retried, report.lost) == (2, 1, 0)
    assert _state(control_conn, reg) == {"d0": ("materialized", 1, 2), "d1": ("pending", 0, 0),
                                         "d2": ("materialized", 1, 2)}
    (error_class,) = control_conn.execute(
        "SELECT routing_error_class FROM ingress_receipts WHERE registration_id = %s AND delivery_id = 'd1'",
        (reg,)).fetchone()
    assert error_class == "UntranslatableCharacter"


def test_a_payload_json_cannot_hold_fails_its_receipt_instead_of_being_stored_as_text(control_conn, reg):
    _admit(control_conn, reg, 2)

    def unserializable_d1(receipt):
        events = _events(receipt)
        if receipt.delivery_id == "d1":  # a set is no JSON value: storing its str() would change the payload
            return [EventSpec("issue", "I-1", "observe:I-1", payload={"labels": {"bug"}}, work=events[0].work)]
        return events

    route_receipts(control_conn, _routes(unserializable_d1), owner="router", limit=500, policy=FAST)
    assert _state(control_conn, reg) == {"d0": ("materialized", 1, 2), "d1": ("pending", 0, 0)}
    (error_class,) = control_conn.execute(
        "SELECT routing_error_class FROM ingress_receipts WHERE registration_id = %s AND delivery_id = 'd1'",
        (reg,)).fetchone()
    assert error_class == "TypeError"


def test_the_same_batch_routed_twice_creates_nothing_new(control_conn, reg):
    _admit(control_conn, reg, 5)
    route_receipts(control_conn, _routes(), owner="router", limit=500)
    before = control_conn.execute(
        "SELECT delivery_id, enqueued_event_ids FROM ingress_receipts WHERE registration_id = %s ORDER BY 1",
        (reg,)).fetchall()
    control_conn.execute("UPDATE ingress_receipts SET routing_status = 'pending', next_attempt_at = now()"
                         " WHERE registration_id = %s", (reg,))
    report = route_receipts(control_conn, _routes(), owner="router-again", limit=500)
    assert report.materialized == 5
    after = control_conn.execute(
        "SELECT delivery_id, enqueued_event_ids FROM ingress_receipts WHERE registration_id = %s ORDER BY 1",
        (reg,)).fetchall()
    assert after == before
    assert set(_state(control_conn, reg).values()) == {("materialized", 1, 2)}
