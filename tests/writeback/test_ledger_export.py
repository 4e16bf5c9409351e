"""The ledger export: the four ledger tables copied from Postgres to the BigQuery control dataset."""

from __future__ import annotations

import uuid

import pytest

from nexus_pipelines.writeback.export import export_ledger

from .support import context, make_config, new_state, seed_source


@pytest.fixture(scope="module")
def source(bq_client):
    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, 40, negative_every=20)
    return dataset


def test_ledger_export_to_bigquery(make_runner, source, bq_client, control_conn):
    state = new_state()
    runner = make_runner(make_config(source), state, job_name="export")
    runner.run(context("exp-1"))
    dataset = f"ctl_{uuid.uuid4().hex[:6]}"
    counts = export_ledger(control_conn, bq_client, "nexus-test", dataset, chunk=7)
    expected_records = control_conn.execute("SELECT count(*) FROM outbound_records").fetchone()[0]
    assert counts["outbound_records"] == expected_records >= 40
    assert set(counts) == {"outbound_job_leases", "outbound_runs", "outbound_records", "outbound_record_attempts"}
    rows = list(bq_client.query(f"SELECT status, COUNT(*) AS n FROM `{dataset}.outbound_records` "
                                "WHERE job_name = 'export' GROUP BY status ORDER BY status").result())
    assert [(r["status"], r["n"]) for r in rows] == [("permanent_failed", 2), ("succeeded", 38)]
    (run,) = bq_client.query(f"SELECT crm_api_usage, execution_id FROM `{dataset}.outbound_runs` "
                             "WHERE run_id = 'exp-1'").result()
    # the CRM's Sforce-Limit-Info (describe, the upsert, its read-back), for analysts too
    assert run["crm_api_usage"] == "3/15000" and run["execution_id"] == runner.execution_id
    again = export_ledger(control_conn, bq_client, "nexus-test", dataset)
    assert again["outbound_records"] == expected_records  # replaced, not appended
