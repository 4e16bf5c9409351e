"""Routing until idle: every due receipt is routed, batch after batch, with its events and
work items created in claim order while the next batch is claimed and planned; budgets stop
it, and a receipt that fails in any batch is recorded alone and counted once."""

from datetime import datetime, timezone

from nexus_pipelines.workqueue.receipts import (
    EventSpec,
    ReceiptIn,
    Route,
    WorkSpec,
    admit_receipts,
    route_until_idle,
)


def _admit(conn, reg: str, n: int) -> None:
    admit_receipts(conn, [
        ReceiptIn(registration_id=reg, revision=1, namespace="poll", delivery_id=f"d{i}", route_key="issues",
                  received_at=datetime.now(timezone.utc), body={"issue": f"I-{i}"})
        for i in range(n)])


def _events(receipt) -> list[EventSpec]:
    issue = receipt.body["issue"]
    return [EventSpec("issue", issue, f"observe:{issue}", payload=receipt.body,
                      work=[WorkSpec("ticket.observe", source_lane_key=issue)])]


def _routes(materialize=_events) -> dict[str, Route]:
    return {"issues": Route("issues", 1, materialize)}


def _statuses(conn, reg: str) -> dict[str, str]:
    return dict(conn.execute("SELECT delivery_id, routing_status FROM ingress_receipts WHERE registration_id = %s",
                             (reg,)).fetchall())


def test_routing_until_idle_routes_every_due_receipt_with_work_items_in_claim_order(pool, control_conn, reg):
    _admit(control_conn, reg, 23)
    report = route_until_idle(pool, _routes(), owner="router", batch=5)
    assert (report.claimed, report.materialized, report.events, report.lost) == (23, 23, 23, 0)
    order = control_conn.execute(
        """SELECT r.receipt_id FROM connector_work_items w JOIN connector_outbox_events e USING (event_id)
             JOIN ingress_receipts r USING (receipt_id) WHERE r.registration_id = %s ORDER BY w.work_id""",
        (reg,)).fetchall()
    assert len(order) == 23 and order == sorted(order)
    assert route_until_idle(pool, _routes(), owner="router", batch=5).claimed == 0


def test_routing_until_idle_stops_at_its_receipt_budget_and_leaves_the_rest_due(pool, control_conn, reg):
    _admit(control_conn, reg, 12)
    report = route_until_idle(pool, _routes(), owner="router", batch=5, max_receipts=7)
    assert (report.claimed, report.materialized) == (7, 7)
    assert sorted(_statuses(control_conn, reg).values()) == ["materialized"] * 7 + ["pending"] * 5
    assert route_until_idle(pool, _routes(), owner="router", batch=5).materialized == 5


def test_a_receipt_failing_in_a_later_batch_is_recorded_alone_and_counted_once(pool, control_conn, reg):
    _admit(control_conn, reg, 10)

    def two_fail(receipt):
        if receipt.delivery_id == "d6":
            raise RuntimeError("the parser broke")  # while planning
        if receipt.delivery_id == "d8":  # jsonb refuses a NUL character: the writer's batch fails
            return [EventSpec("issue", "I-8", "observe:I-8", payload={"title": "a\u0000b"},
                              work=[WorkSpec("ticket.observe")])]
        return _events(receipt)

    report = route_until_idle(pool, _routes(two_fail), owner="router", batch=4)
    assert (report.claimed, report.materialized, report.retried, report.failed, report.lost) == (10, 8, 2, 0, 0)
    statuses = _statuses(control_conn, reg)
    assert (statuses.pop("d6"), statuses.pop("d8")) == ("pending", "pending")
    assert set(statuses.values()) == {"materialized"}
