"""A route run that creates more work items than the work item table's statistics count
analyzes the table, so the drains that follow are planned on what it holds; a run inside
what the statistics count leaves them alone (docs/design/work-queue.md, "Routing")."""

from datetime import datetime, timezone

from nexus_pipelines.workqueue.receipts import EventSpec, ReceiptIn, Route, WorkSpec, admit_receipts, route_until_idle


def _admit(conn, reg: str, n: int) -> None:
    admit_receipts(conn, [
        ReceiptIn(registration_id=reg, revision=1, namespace="poll", delivery_id=f"d{i}", route_key="issues",
                  received_at=datetime.now(timezone.utc), body={"issue": f"I-{i}"})
        for i in range(n)])


def _routes() -> dict[str, Route]:
    def events(receipt) -> list[EventSpec]:
        issue = receipt.body["issue"]
        return [EventSpec("issue", issue, f"observe:{issue}", payload=receipt.body,
                          work=[WorkSpec("ticket.observe", source_lane_key=issue, target_lane_key=f"t:{issue}")])]
    return {"issues": Route("issues", 1, events)}


def _counted(conn) -> tuple[float, int]:
    """What the statistics count, and what the table holds."""
    return conn.execute("""SELECT (SELECT reltuples FROM pg_class WHERE oid = 'connector_work_items'::regclass),
                                  (SELECT count(*) FROM connector_work_items)""").fetchone()


def test_a_route_run_that_outgrows_the_statistics_taken_of_the_table_analyzes_it(pool, control_conn, reg):
    control_conn.execute("ANALYZE connector_work_items")
    counted, held = _counted(control_conn)
    assert counted == held
    _admit(control_conn, reg, held + 30)
    report = route_until_idle(pool, _routes(), owner="router")
    assert report.work_items == held + 30
    assert _counted(control_conn) == (2 * held + 30, 2 * held + 30)


def test_a_route_run_inside_what_the_statistics_count_leaves_them(pool, control_conn, reg):
    _admit(control_conn, f"{reg}-first", 40)
    route_until_idle(pool, _routes(), owner="router")
    control_conn.execute("ANALYZE connector_work_items")
    counted, held = _counted(control_conn)
    _admit(control_conn, reg, 5)
    assert route_until_idle(pool, _routes(), owner="router").work_items == 5
    assert _counted(control_conn) == (counted, held + 5)
