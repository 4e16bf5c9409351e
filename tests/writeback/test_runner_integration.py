"""The runner end to end: real Postgres ledger, BigQuery emulator, NexusCRM simulator."""

from __future__ import annotations

import uuid

import pytest

from nexus_pipelines.writeback.jobs.month_end_arr.demo_data import seed_source
from nexus_pipelines.writeback.source import candidate_table_id

from .conftest import context, make_config


@pytest.fixture(scope="module")
def source(bq_client):
    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, 450, negative_every=100)
    return dataset


def test_first_run_writes_everything_and_rerun_skips_unchanged(source, make_runner, sim_state, control_conn, bq_client):
    config = make_config(source)
    first = make_runner(config, sim_state).run(context("r1"))
    assert first.status == "completed_with_errors"
    assert first.selected == 450
    assert first.succeeded == 446 and first.permanently_failed == 4 and first.retryable_failed == 0
    assert first.new_permanent_failures == 4
    assert first.batches == 3 and sim_state.calls()["upsert"] == 3
    assert first.exit_code == 2
    assert len(sim_state.records("Month_End_ARR__c")) == 446

    second = make_runner(config, sim_state).run(context("r2"))
    assert second.status == "succeeded", second
    assert second.unchanged == 450 and second.succeeded == 0
    assert sim_state.calls()["upsert"] == 3
    assert second.exit_code == 0

    runs = dict(control_conn.execute("SELECT run_id, status FROM outbound_runs").fetchall())
    assert runs == {"r1": "completed_with_errors", "r2": "succeeded"}
    assert control_conn.execute("SELECT count(*) FROM outbound_record_attempts").fetchone()[0] == 450
    assert control_conn.execute("SELECT count(*) FROM leases").fetchone()[0] == 0
    tables = [t.table_id for t in bq_client.list_tables(config.config.state.dataset)]
    assert not [t for t in tables if t.startswith("wb_candidates_")]
