"""A claim of a first sync's backlog reads about its batch while the statistics still say the
work item table is empty (never analyzed, or analyzed before the sync): its source lane head
probe reads the lane's own index entries, not every due item of the registration (each test
has a database of its own, so its statistics are the ones it sets up)."""

from __future__ import annotations

import psycopg
import pytest

from nexus_pipelines.control.db import connect
from nexus_pipelines.workqueue.receipts import NewWork
from tests.conftest import drop_database, new_database, with_database

from .conftest import enqueue
from .support import claim_plan, work_item_rows_read

BACKLOG = 1000
BATCH = 100


@pytest.fixture(params=["never_analyzed", "analyzed_empty"])
def first_sync_conn(request, pg_admin_dsn, pg_template):
    name = new_database(pg_admin_dsn, pg_template)
    try:
        with connect(with_database(pg_admin_dsn, name)) as conn:
            if request.param == "analyzed_empty":
                conn.execute("ANALYZE connector_work_items")
            yield conn
    finally:
        drop_database(pg_admin_dsn, name)


def test_a_first_sync_claim_reads_about_its_batch_while_the_statistics_say_empty(first_sync_conn, reg):
    # one source lane and one target lane per item, as a first sync's ticket.observe items
    enqueue(first_sync_conn, reg, [NewWork(f"i{n}", "ticket.observe", source_lane_key=f"ref-{n}",
                                           target_lane_key=f"ticket-{n}") for n in range(BACKLOG)])
    with first_sync_conn.transaction():
        plan = claim_plan(first_sync_conn, reg, BATCH)
        # the walk, one head probe entry and one compare-and-swap per item taken (before:
        # every head probe also read the registration's due items below it, ~BATCH^2 / 2)
        assert plan["Actual Rows"] == BATCH and work_item_rows_read(plan) <= 4 * BATCH, plan
        raise psycopg.Rollback()
