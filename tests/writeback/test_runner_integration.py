"""The runner end to end: real Postgres ledger, BigQuery emulator, NexusCRM simulator."""

from __future__ import annotations

import uuid

import pytest


from .support import context, make_config, seed_source


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
    assert not [t for t in tables if t.startswith("wb_candidates_month_end_arr_")]  # this job's, all dropped


def test_query_pages_send_batches_in_external_id_order_and_size(bq_client, make_runner, sim_state):
    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, 25)
    # Key order is the query pages' (a Storage Read stream has the table's order).
    runner = make_runner(make_config(dataset, batch_size=10), sim_state, job_name="order", storage=None)
    result = runner.run(context("order-1"))
    assert result.batches == 3
    sizes = [e.record_count for e in sim_state.request_log() if "composite" in e.path]
    assert sizes == [10, 10, 5]

    batches = make_runner(make_config(dataset), sim_state, job_name="order").ledger.conn.execute(
        "SELECT batch_id, min(external_id), max(external_id) FROM outbound_record_attempts "
        "WHERE run_id = 'order-1' GROUP BY batch_id ORDER BY batch_id").fetchall()
    execution = runner.execution_id  # batch ids name the execution: a replay of the run id never repeats them
    assert [b[0] for b in batches] == [f"order-1:{execution}:00000{n}" for n in (1, 2, 3)]
    assert batches[0][2] < batches[1][1] and batches[1][2] < batches[2][1]


def _run_events(runner, run_id: str):
    from nexus_pipelines.writeback.contract import JobResult
    from nexus_pipelines.writeback.runner import STAGE_VALIDATION, Progress, StageDone

    events = list(runner.execute(context(run_id)))
    assert isinstance(events[-1], JobResult)
    validation = next(e for e in events if isinstance(e, StageDone) and e.stage == STAGE_VALIDATION)
    return (events[-1], validation.metadata["read_with"], [e.message for e in events if isinstance(e, Progress)])


def test_a_run_reads_its_candidates_with_the_storage_read_api(source, make_runner, sim_state):
    result, read_with, messages = _run_events(make_runner(make_config(source), sim_state, job_name="arrow"), "a1")
    assert read_with == "storage_read_api"
    assert result.succeeded == 446 and result.permanently_failed == 4
    assert not [m for m in messages if "Storage Read" in m]


def test_a_run_refused_the_storage_read_api_writes_every_row_from_queries_and_says_why(
        source, make_runner, sim_state, refusing_storage):
    runner = make_runner(make_config(source), sim_state, job_name="refused", storage=refusing_storage)
    result, read_with, messages = _run_events(runner, "refused-1")
    assert read_with == "query_pages"
    assert result.selected == 450 and result.succeeded == 446 and result.permanently_failed == 4
    (warning,) = [m for m in messages if "Storage Read" in m]
    assert "roles/bigquery.readSessionUser" in warning and "read with queries" in warning


def test_mistyped_source_column_fails_the_mapping_check_before_writes(bq_client, make_runner, sim_state):
    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, 10)
    bq_client.query(f"CREATE OR REPLACE TABLE `{dataset}.month_end_arr` AS SELECT * REPLACE "
                    f"(CAST(arr_amount AS FLOAT64) AS arr_amount) FROM `{dataset}.month_end_arr`").result()
    result = make_runner(make_config(dataset), sim_state, job_name="typed").run(context())
    assert result.status == "failed" and "column arr_amount is FLOAT" in result.error_message
    assert sim_state.calls().get("upsert", 0) == 0


def test_writeback_job_implements_the_job_protocol(bq_client, control_dsn, source, sim_state):
    from nexus_pipelines.control.db import connect
    from nexus_pipelines.writeback.contract import Job
    from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper
    from nexus_pipelines.writeback.runner import RunFailed, WritebackJob

    from .support import crm_factory

    with connect(control_dsn) as conn:
        job = WritebackJob("protocol", MonthEndArrMapper(), make_config(source), bq=bq_client, conn=conn,
                           crm_factory=crm_factory(sim_state))
        assert isinstance(job, Job) and job.name == "protocol"
        job.validate(context())
        assert sim_state.calls().get("upsert", 0) == 0
        broken = WritebackJob("protocol", MonthEndArrMapper(), make_config("no_such_dataset"), bq=bq_client,
                              conn=conn, crm_factory=crm_factory(sim_state))
        with pytest.raises(RunFailed):
            broken.validate(context())
