"""A router's claim reads its batch of due receipts, not the whole backlog, whatever the
statistics say (its own module: the claim takes every due receipt of the database)."""

from datetime import datetime, timedelta, timezone

from nexus_pipelines.workqueue.receipts import ReceiptIn, admit_receipts, claim_receipts, hold_receipts

BACKLOG = 3000
BATCH = 50


def _admit(conn, reg: str, n: int) -> None:
    admit_receipts(conn, [
        ReceiptIn(registration_id=reg, revision=1, namespace="poll", delivery_id=f"d{i}", route_key="issues",
                  received_at=datetime.now(timezone.utc), body={"issue": f"I-{i}"})
        for i in range(n)])


def _receipt_rows_read(conn) -> int:
    """Rows of ingress_receipts read so far by scans of any kind (this connection's flushed first)."""
    conn.execute("SELECT pg_stat_force_next_flush()")  # flushed when this statement ends
    conn.execute("SELECT pg_stat_clear_snapshot()")
    (rows,) = conn.execute("""SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
                                FROM pg_stat_user_tables WHERE relname = 'ingress_receipts'""").fetchone()
    return rows


def _claim_reads(conn, reg: str) -> int:
    before = _receipt_rows_read(conn)
    claimed = claim_receipts(conn, owner="router", limit=BATCH, lease_ttl=timedelta(seconds=60))
    read = _receipt_rows_read(conn) - before
    assert [c.delivery_id for c in claimed] == [f"d{i}" for i in range(BATCH)]
    return read


def test_a_claim_reads_its_batch_of_a_backlog_never_analyzed(control_conn, reg):
    _admit(control_conn, reg, BACKLOG)
    read = _claim_reads(control_conn, reg)
    assert read <= 3 * BATCH, read  # the batch found in the due index and updated, not the backlog


def test_a_claim_reads_its_batch_of_a_backlog_statistics_say_is_not_due(control_conn, reg):
    # statistics from before the sync: every receipt routed, none due
    control_conn.execute("UPDATE ingress_receipts SET routing_status = 'materialized', materialized_at = now()")
    _admit(control_conn, f"{reg}-old", BACKLOG)
    control_conn.execute("UPDATE ingress_receipts SET routing_status = 'materialized', materialized_at = now()")
    control_conn.execute("ANALYZE ingress_receipts")
    _admit(control_conn, reg, BACKLOG)  # then the sync's receipts arrive
    read = _claim_reads(control_conn, reg)
    assert read <= 3 * BATCH, read


def test_holding_a_claimed_batch_reads_the_batch_statistics_say_none_routes(control_conn, reg):
    # statistics from after a poll: every receipt pending, none routing
    control_conn.execute("UPDATE ingress_receipts SET routing_status = 'materialized', materialized_at = now()")
    _admit(control_conn, reg, BACKLOG)
    control_conn.execute("ANALYZE ingress_receipts")
    claimed = claim_receipts(control_conn, owner="router", limit=BACKLOG // 6, lease_ttl=timedelta(seconds=60))
    before = _receipt_rows_read(control_conn)
    with control_conn.transaction(force_rollback=True):
        held = hold_receipts(control_conn, claimed)
    read = _receipt_rows_read(control_conn) - before
    assert held == {c.receipt_id for c in claimed}
    assert read <= 2 * len(claimed), read  # one primary-key probe per receipt, not the table per batch
