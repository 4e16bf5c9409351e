"""`nexus-pipelines run-job`: the writeback's Cloud Run Job command and its exit codes, through
click's runner against the simulator served over HTTP."""

from __future__ import annotations

import uuid

import pytest
from click.testing import CliRunner

from nexus_pipelines.cli import main
from nexus_pipelines.local.simulators.http import serve_in_thread
from nexus_pipelines.local.simulators.nexuscrm import Fault, build_nexuscrm_app
from nexus_pipelines.local.month_end_arr_source import mark_load

from .support import new_state, seed_source, write_config


@pytest.fixture(scope="module")
def source(bq_client):
    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, 40, negative_every=20)
    return dataset


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


def test_run_job_cli_exit_codes(tmp_path, cli_env, source, bq_client):
    state = cli_env
    path = write_config(tmp_path, source, local_mode=True)
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

    https_only = write_config(tmp_path, source)  # local_mode off: the http simulator URL is refused
    refused = runner.invoke(main, ["run-job", "--job", "month_end_arr", "--config", https_only, "--force"])
    assert refused.exit_code == 1 and "https" in refused.output

    other = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, other, 5)
    mark_load(bq_client, other, load_run_id="late", status="failed")
    not_ready = runner.invoke(main, ["run-job", "--job", "month_end_arr", "--config", write_config(tmp_path, other, local_mode=True)])
    assert not_ready.exit_code == 1 and "not ready" in not_ready.output

    unknown = runner.invoke(main, ["run-job", "--job", "nope", "--config", path])
    assert unknown.exit_code != 0 and "unknown writeback job" in unknown.output


@pytest.mark.parametrize("arrange,args,reason", [
    (lambda crm: None, ["--external-id", "001999999999999:2025-01"],
     "1 of the 1 external IDs asked for are not in the source: 001999999999999:2025-01"),
    (lambda crm: setattr(crm, "api_limit", 1), ["--force"],  # the describe spends it; the upsert is refused
     "the org's daily API allocation is spent (api-usage=1/1)"),
    (lambda crm: crm.faults.push(Fault.reject_request("INVALID_FIELD", "No such column 'Renamed__c'")), ["--force"],
     "NexusCRM rejected the whole upsert request (HTTP 400 INVALID_FIELD: No such column 'Renamed__c')"),
], ids=["canary-not-in-source", "api-allocation-spent", "whole-request-400"])
def test_a_run_that_fails_exits_1_with_one_line_saying_why(tmp_path, cli_env, source, arrange, args, reason):
    arrange(cli_env)
    result = CliRunner().invoke(main, ["run-job", "--job", "month_end_arr", "--config",
                                       write_config(tmp_path, source, local_mode=True), *args])
    assert result.exit_code == 1, result.output
    summary, dagster_run = result.output.strip().splitlines()
    assert summary.startswith("month_end_arr run ") and ": failed (" in summary and reason in summary, summary
    assert summary.count("month_end_arr run ") == 1, summary  # the run is named once
    assert dagster_run.startswith("Dagster run ") and "Traceback" not in result.output


def outbound_run_ids(control_dsn) -> set[str]:
    from nexus_pipelines.control.db import connect

    with connect(control_dsn) as conn:
        return {r[0] for r in conn.execute("SELECT run_id FROM outbound_runs")}


@pytest.mark.parametrize("unset,target,message", [
    ("NEXUSCRM_CLIENT_SECRET", {"local_mode": True},
     "environment variable NEXUSCRM_CLIENT_SECRET is not set; set it to the NexusCRM client secret"),
    (None, {}, "the NexusCRM base URL must use https (http is allowed only with target.local_mode)"),
])
def test_crm_settings_are_checked_before_a_run_starts(tmp_path, cli_env, source, control_dsn, monkeypatch,
                                                      unset, target, message):
    if unset:
        monkeypatch.delenv(unset)
    before = outbound_run_ids(control_dsn)
    result = CliRunner().invoke(main, ["run-job", "--job", "month_end_arr", "--config",
                                       write_config(tmp_path, source, **target), "--run-id", "never-started"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"Error: {message}"]
    assert outbound_run_ids(control_dsn) == before and cli_env.calls() == {}


def test_an_unreachable_control_plane_is_one_line_before_a_run_starts(tmp_path, cli_env, source, monkeypatch):
    monkeypatch.setenv("NEXUS_PG_DSN", "postgresql://nobody@127.0.0.1:9/nexus")
    result = CliRunner().invoke(main, ["run-job", "--job", "month_end_arr", "--config",
                                       write_config(tmp_path, source, local_mode=True)])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "cannot reach the control plane at 127.0.0.1:9/nexus" in result.output
    assert cli_env.calls() == {}


def test_a_run_with_record_errors_prints_its_summary_and_dagster_run_id_and_no_traceback(
        tmp_path, cli_env, bq_client, control_dsn, bq_emulator_url):
    import os
    import subprocess
    import sys

    from nexus_pipelines.settings import PROJECT_ROOT

    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, 40, negative_every=20)
    path = write_config(tmp_path, dataset, local_mode=True)
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    (tmp_path / "dagster_home").mkdir()
    done = subprocess.run([sys.executable, "-m", "nexus_pipelines.cli", "run-job", "--job", "month_end_arr",
                           "--config", path, "--run-id", "cli-errors"], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "dagster._core" not in done.stderr + done.stdout
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("month_end_arr run cli-errors: completed_with_errors (selected=40")
    assert "first rejected: 001000000000001:2025-08 FIELD_CUSTOM_VALIDATION_EXCEPTION, 001000000000003:2025-04" in lines[0]
    assert lines[1].startswith("Dagster run ") and "make dev" in lines[1]
    from dagster import DagsterInstance

    dagster_run_id = lines[1].split()[2]
    with DagsterInstance.from_config(str(tmp_path / "dagster_home")) as instance:
        assert instance.get_run_by_id(dagster_run_id).job_name == "writeback_month_end_arr_job"


def test_a_run_id_that_is_not_one_printable_token_is_refused_before_anything_runs():
    from click.testing import CliRunner

    from nexus_pipelines.cli import main

    result = CliRunner().invoke(main, ["run-job", "--job", "month_end_arr", "--config", "configs/jobs/month_end_arr.yaml",
                                       "--run-id", "run\nforged line"], env={"NEXUS_PG_DSN": "host=127.0.0.1 port=1"})
    assert result.exit_code == 2 and "Invalid value for --run-id" in result.output
    assert "forged line" not in result.output


def test_run_job_cli_line_names_the_live_holder_of_a_skip_and_the_dead_one_taken_over(tmp_path, cli_env, source,
                                                                                       control_dsn):
    from datetime import timedelta

    from nexus_pipelines.control.db import connect
    from nexus_pipelines.writeback.ledger import Ledger

    path = write_config(tmp_path, source, local_mode=True)
    runner = CliRunner()
    with connect(control_dsn) as holder_conn:
        holder = Ledger(holder_conn, "month_end_arr", "Month_End_ARR__c")
        lease = holder.acquire_lease("holding", timedelta(minutes=30))
        holder.start_run("holding", dry_run=False, options={}, lease_token=lease.token)
        skipped = runner.invoke(main, ["run-job", "--job", "month_end_arr", "--config", path, "--run-id", "cli-skip"])
        assert skipped.exit_code == 0, skipped.output
        assert skipped.output.splitlines()[0] == (
            "month_end_arr run cli-skip: skipped_already_running (selected=0, unchanged=0, succeeded=0, "
            "retryable_failed=0, permanently_failed=0, new_permanent_failures=0, blocking_failures=0, deferred=0, "
            "batches=0, crm_calls=0, read_back_calls=0): another execution holds the month_end_arr lease: run "
            f"holding (execution {holder.execution_id}) holds it until {lease.expires_at:%Y-%m-%d %H:%M:%S} UTC")
    # the holder's session is gone now
    took = runner.invoke(main, ["run-job", "--job", "month_end_arr", "--config", path, "--run-id", "cli-took"])
    assert took.exit_code in (0, 2), took.output
    assert (f"(took over the month_end_arr lease and marked run holding execution {holder.execution_id} abandoned: "
            "its control-plane session ended while it held the lease") in took.output.splitlines()[0]
