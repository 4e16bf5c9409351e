"""The ledger export: the four ledger tables copied from Postgres to the BigQuery control dataset
by load jobs; leases, runs and records replaced whole, attempts appended since the last export."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from nexus_pipelines.control.db import connect
from nexus_pipelines.writeback import export
from nexus_pipelines.writeback.export import ATTEMPTS, LedgerExportError, export_ledger

from .support import context, make_config, new_state, seed_source


@pytest.fixture(scope="module")
def source(bq_client):
    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, 40, negative_every=20)
    return dataset


def _bq_count(bq_client, dataset: str, table: str, where: str = "TRUE") -> int:
    (row,) = bq_client.query(f"SELECT COUNT(*) AS n FROM `{dataset}.{table}` WHERE {where}").result()
    return row["n"]


def _pg_count(conn, table: str) -> int:
    return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_ledger_export_to_bigquery(make_runner, source, bq_client, control_conn):
    state = new_state()
    runner = make_runner(make_config(source), state, job_name="export")
    runner.run(context("exp-1"))
    dataset = f"ctl_{uuid.uuid4().hex[:6]}"
    counts = export_ledger(control_conn, bq_client, "nexus-test", dataset, chunk=7)
    expected_records = _pg_count(control_conn, "outbound_records")
    assert counts["outbound_records"] == expected_records >= 40
    assert set(counts) == {"outbound_job_leases", "outbound_runs", "outbound_records", ATTEMPTS}
    assert counts["outbound_job_leases"] == _bq_count(bq_client, dataset, "outbound_job_leases") == 0
    rows = list(bq_client.query(f"SELECT status, COUNT(*) AS n FROM `{dataset}.outbound_records` "
                                "WHERE job_name = 'export' GROUP BY status ORDER BY status").result())
    assert [(r["status"], r["n"]) for r in rows] == [("permanent_failed", 2), ("succeeded", 38)]
    (run,) = bq_client.query(f"SELECT crm_api_usage, execution_id FROM `{dataset}.outbound_runs` "
                             "WHERE run_id = 'exp-1'").result()
    # the CRM's Sforce-Limit-Info (describe, the upsert, its read-back), for analysts too
    assert run["crm_api_usage"] == "3/15000" and run["execution_id"] == runner.execution_id
    again = export_ledger(control_conn, bq_client, "nexus-test", dataset)
    assert again["outbound_records"] == expected_records == _bq_count(bq_client, dataset, "outbound_records")
    assert again[ATTEMPTS] == 0  # nothing committed since: nothing appended


def test_only_the_attempts_committed_since_the_last_export_are_appended(make_runner, source, bq_client, control_conn):
    dataset = f"ctl_{uuid.uuid4().hex[:6]}"
    runner = make_runner(make_config(source), new_state(), job_name="export-increment")
    runner.run(context("inc-1"))
    first = export_ledger(control_conn, bq_client, "nexus-test", dataset)
    assert first[ATTEMPTS] == _pg_count(control_conn, ATTEMPTS) > 0
    runner.run(context("inc-2", force=True))  # every row sent again: 40 new attempts
    second = export_ledger(control_conn, bq_client, "nexus-test", dataset, chunk=9)
    assert second[ATTEMPTS] == control_conn.execute(
        f"SELECT count(*) FROM {ATTEMPTS} WHERE run_id = 'inc-2'").fetchone()[0] == 40
    assert _bq_count(bq_client, dataset, ATTEMPTS) == _pg_count(control_conn, ATTEMPTS)
    assert _bq_count(bq_client, dataset, ATTEMPTS, "run_id = 'inc-1'") == control_conn.execute(
        f"SELECT count(*) FROM {ATTEMPTS} WHERE run_id = 'inc-1'").fetchone()[0]


def test_a_failure_halfway_through_an_export_leaves_the_previous_copy_whole(make_runner, source, bq_client,
                                                                             control_conn):
    dataset = f"ctl_{uuid.uuid4().hex[:6]}"
    make_runner(make_config(source), new_state(), job_name="export-fails").run(context("fail-1"))
    export_ledger(control_conn, bq_client, "nexus-test", dataset, chunk=7)
    before = sorted(tuple(r.values()) for r in bq_client.query(
        f"SELECT external_id, status, updated_at FROM `{dataset}.outbound_records`").result())
    attempts_before = _bq_count(bq_client, dataset, ATTEMPTS)
    make_runner(make_config(source), new_state(), job_name="export-fails").run(context("fail-2", force=True))
    # A row Postgres holds but cannot hand over ('infinity' is no datetime): reading the records
    # fails after several chunks, halfway through the table.
    control_conn.execute("INSERT INTO outbound_records (job_name, target_object, external_id, payload_hash, status,"
                         " attempt_count, updated_at) VALUES ('export-fails', 'X', 'zz-last', 'h', 'succeeded', 1,"
                         " 'infinity')")
    try:
        with pytest.raises(psycopg.DataError):
            export_ledger(control_conn, bq_client, "nexus-test", dataset, chunk=7)
    finally:
        control_conn.execute("DELETE FROM outbound_records WHERE external_id = 'zz-last'")
    after = sorted(tuple(r.values()) for r in bq_client.query(
        f"SELECT external_id, status, updated_at FROM `{dataset}.outbound_records`").result())
    assert after == before  # the previous copy, whole: not emptied, not partial
    assert _bq_count(bq_client, dataset, ATTEMPTS) == attempts_before  # its turn never came
    export_ledger(control_conn, bq_client, "nexus-test", dataset)  # the next export catches up
    assert _bq_count(bq_client, dataset, ATTEMPTS) == _pg_count(control_conn, ATTEMPTS)


def test_an_export_that_died_after_its_load_job_appends_nothing_twice(make_runner, source, bq_client, control_conn):
    dataset = f"ctl_{uuid.uuid4().hex[:6]}"
    runner = make_runner(make_config(source), new_state(), job_name="export-dies")
    runner.run(context("dies-1"))
    export_ledger(control_conn, bq_client, "nexus-test", dataset)
    runner.run(context("dies-2", force=True))
    export._load_increment(control_conn, bq_client, f"nexus-test.{dataset}.{ATTEMPTS}", 100)  # then it dies, unrecorded
    assert _bq_count(bq_client, dataset, ATTEMPTS) == _pg_count(control_conn, ATTEMPTS)  # the load landed
    export_ledger(control_conn, bq_client, "nexus-test", dataset)
    assert _bq_count(bq_client, dataset, ATTEMPTS) == _pg_count(control_conn, ATTEMPTS)
    (row,) = bq_client.query(f"SELECT COUNT(*) AS n FROM (SELECT run_id, batch_id, external_id, attempt_number "
                             f"FROM `{dataset}.{ATTEMPTS}` GROUP BY 1, 2, 3, 4 HAVING COUNT(*) > 1)").result()
    assert row["n"] == 0


def test_a_second_export_to_the_same_dataset_at_once_is_refused_in_one_line(bq_client, control_conn, control_dsn):
    dataset = f"ctl_{uuid.uuid4().hex[:6]}"
    with connect(control_dsn) as other, export._exclusive(other, f"nexus-test.{dataset}"):
        with pytest.raises(LedgerExportError, match=f"another ledger export to nexus-test.{dataset} is running"):
            export_ledger(control_conn, bq_client, "nexus-test", dataset)
