"""Redaction in logs and ledger, the run-job CLI with its exit codes, the ledger export."""

from __future__ import annotations

import logging
import uuid

import pytest
from click.testing import CliRunner

from nexus_pipelines.cli import main
from nexus_pipelines.local.simulators.nexuscrm import Fault, build_nexuscrm_app, serve_in_thread
from nexus_pipelines.writeback.export import export_ledger
from nexus_pipelines.writeback.jobs.month_end_arr.demo_data import mark_load, seed_source
from nexus_pipelines.writeback.logs import render_event

from .conftest import context, make_config, new_state
from .test_dagster import write_config


@pytest.fixture(scope="module")
def source(bq_client):
    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, 40, negative_every=20)
    return dataset


def test_logs_never_carry_tokens_secrets_payloads_or_customer_fields(bq_client, make_runner, source, caplog,
                                                                      control_conn):
    state = new_state()
    state.faults.push(Fault.expire_token())
    caplog.set_level(logging.DEBUG)
    runner = make_runner(make_config(source, batch_size=10), state, job_name="redact")
    result = runner.run(context("redact-1"))
    assert result.succeeded == 38
    text = caplog.text
    assert "batch_committed" in text and "redact-1" in text
    for forbidden in (state.client_secret, state.client_id, "Bearer 00Dsim", "00Dsim!", "001000000000001",
                      "Month_End_ARR_Key__c\": \"", "ARR_Amount__c", "Cloud", "12.75"):
        assert forbidden not in text, forbidden
    # nor in the ledger
    dump = str(control_conn.execute("SELECT * FROM outbound_runs WHERE job_name = 'redact'").fetchall())
    dump += str(control_conn.execute("SELECT error_message FROM outbound_record_attempts WHERE job_name = 'redact'").fetchall())
    assert state.client_secret not in dump and "Bearer" not in dump


def test_render_event_refuses_secret_keys_and_sanitizes_values():
    with pytest.raises(ValueError):
        render_event("x", authorization="Bearer abc")
    with pytest.raises(ValueError):
        render_event("x", payload={"a": 1})
    line = render_event("x", error="failed with Bearer abc.def for jane@example.com\n" + "y" * 1000)
    assert "abc.def" not in line and "jane@example.com" not in line and len(line) < 400 and "\\n" not in line


@pytest.fixture
def cli_env(monkeypatch, control_dsn, bq_emulator_url):
    state = new_state()
    url, stop = serve_in_thread(build_nexuscrm_app(state))
    monkeypatch.setenv("NEXUS_PG_DSN", control_dsn)
    monkeypatch.setenv("NEXUS_BQ_EMULATOR_URL", bq_emulator_url)
    monkeypatch.setenv("NEXUS_BQ_PROJECT", "nexus-test")
    monkeypatch.setenv("NEXUSCRM_BASE_URL", url)
    monkeypatch.setenv("NEXUSCRM_CLIENT_ID", state.client_id)
    monkeypatch.setenv("NEXUSCRM_CLIENT_SECRET", state.client_secret)
    yield state
    stop()


def local_config(tmp_path, source, **target):
    import yaml

    path = write_config(tmp_path, source)
    data = yaml.safe_load(open(path))
    data["target"].update(target)
    open(path, "w").write(yaml.safe_dump(data))
    return path


def test_run_job_cli_exit_codes(tmp_path, cli_env, source, bq_client):
    state = cli_env
    path = local_config(tmp_path, source, local_mode=True)
    runner = CliRunner()
    dry = runner.invoke(main, ["run-job", "--job", "month_end_arr", "--config", path, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "dry_run" in dry.output and state.calls().get("upsert", 0) == 0

    canary = runner.invoke(main, ["run-job", "--job", "month_end_arr", "--config", path, "--external-id",
                                  "001000000000000:2025-02", "--run-id", "cli-canary"])
    assert canary.exit_code == 0 and "cli-canary: succeeded" in canary.output, canary.output
    assert len(state.records("Month_End_ARR__c")) == 1

    full = runner.invoke(main, ["run-job", "--job", "month_end_arr", "--config", path])
    assert full.exit_code == 2 and "completed_with_errors" in full.output  # 2 new permanent failures
    again = runner.invoke(main, ["run-job", "--job", "month_end_arr", "--config", path])
    assert again.exit_code == 0 and "succeeded" in again.output and "unchanged=40" in again.output

    https_only = local_config(tmp_path, source)  # local_mode off: the http simulator URL is refused
    refused = runner.invoke(main, ["run-job", "--job", "month_end_arr", "--config", https_only, "--force"])
    assert refused.exit_code == 1 and "https" in refused.output

    other = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, other, 5)
    mark_load(bq_client, other, load_run_id="late", status="failed")
    not_ready = runner.invoke(main, ["run-job", "--job", "month_end_arr", "--config", local_config(tmp_path, other, local_mode=True)])
    assert not_ready.exit_code == 1 and "not ready" in not_ready.output

    unknown = runner.invoke(main, ["run-job", "--job", "nope", "--config", path])
    assert unknown.exit_code != 0 and "unknown writeback job" in unknown.output


def test_ledger_export_to_bigquery(make_runner, source, bq_client, control_conn):
    state = new_state()
    make_runner(make_config(source), state, job_name="export").run(context("exp-1"))
    dataset = f"ctl_{uuid.uuid4().hex[:6]}"
    counts = export_ledger(control_conn, bq_client, "nexus-test", dataset, chunk=7)
    expected_records = control_conn.execute("SELECT count(*) FROM outbound_records").fetchone()[0]
    assert counts["outbound_records"] == expected_records >= 40
    assert set(counts) == {"outbound_job_leases", "outbound_runs", "outbound_records", "outbound_record_attempts"}
    rows = list(bq_client.query(f"SELECT status, COUNT(*) AS n FROM `{dataset}.outbound_records` "
                                "WHERE job_name = 'export' GROUP BY status ORDER BY status").result())
    assert [(r["status"], r["n"]) for r in rows] == [("permanent_failed", 2), ("succeeded", 38)]
    again = export_ledger(control_conn, bq_client, "nexus-test", dataset)
    assert again["outbound_records"] == expected_records  # replaced, not appended
