"""What the hot path (claim, completion) writes to the WAL for each work item."""

from __future__ import annotations

from datetime import timedelta

from nexus_pipelines.control.db import connect
from nexus_pipelines.workqueue import claims
from nexus_pipelines.workqueue.execution import default_worker_id
from nexus_pipelines.workqueue.receipts import NewWork

from .conftest import enqueue


def _heap_records(conn, start) -> list[tuple[str, int]]:
    """(record type, block references) of each WAL record since `start` on the work items' heap."""
    return conn.execute(
        """SELECT b.resource_manager || '/' || b.record_type, count(*)
             FROM pg_get_wal_block_info(%s, pg_current_wal_flush_lsn()) b
            WHERE b.relfilenode = pg_relation_filenode('connector_work_items')
            GROUP BY b.start_lsn, b.resource_manager, b.record_type""", (start,)).fetchall()


def test_an_items_claim_and_completion_stay_on_its_page_while_an_older_snapshot_is_open(control_conn, control_dsn, reg):
    """The two row versions an item writes while it runs fit on its page beside the version
    it was enqueued as, which a snapshot older than the claim (another drain's statement in
    flight) keeps from being pruned. An update that moves to another page also logs a lock
    of the old version and the whole new row."""
    control_conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    control_conn.execute("SET synchronous_commit = on")  # the suite's server defers flushes; WAL is read to the flush
    enqueue(control_conn, reg, [NewWork(f"p{i}-{reg}", "t", source_lane_key=f"s{i}", target_lane_key=f"t{i}")
                                for i in range(120)])
    with connect(control_dsn) as reader, reader.transaction():
        reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM connector_work_items").fetchone()  # its snapshot, held to the end
        (start,) = control_conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
        got = claims.claim_batch(control_conn, owner=default_worker_id(), limit=120, lease_ttl=timedelta(minutes=1),
                                 registration_ids=[reg])
        assert claims.complete(control_conn, [i.fence for i in got]) == {i.work_id for i in got}
        records = _heap_records(control_conn, start)
    updates = [blocks for kind, blocks in records if kind.startswith("Heap/UPDATE")]
    assert len(got) == 120 and len(updates) == 240
    assert updates == [1] * 240 and not [kind for kind, _ in records if kind == "Heap/LOCK"]
