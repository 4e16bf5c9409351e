"""`nexus-pipelines writeback runs|records|attempts`: the ledger for operators, without SQL
(filters by job, status, external id and run id; a table or --json)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from nexus_pipelines.cli import main

from .support import context, make_config, new_state, seed


@pytest.fixture(scope="module")
def ledger(bq_client, control_dsn):
    """Two runs of one job: 4 permanent failures, then an unchanged rerun."""
    from nexus_pipelines.control.db import connect
    from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper
    from nexus_pipelines.writeback.runner import Runner

    from .support import crm_factory

    config, state = make_config(seed(bq_client, 40, negative_every=10)), new_state()
    with connect(control_dsn) as conn:
        for run_id in ("ledger-1", "ledger-2"):
            Runner("cli_job", MonthEndArrMapper(), config, bq=bq_client, conn=conn,
                   crm_factory=crm_factory(state)).run(context(run_id))
    return control_dsn


def invoke(monkeypatch, dsn, *args):
    monkeypatch.setenv("NEXUS_PG_DSN", dsn)
    return CliRunner().invoke(main, ["writeback", *args])


def test_runs_lists_the_newest_first_with_their_counts(ledger, monkeypatch):
    result = invoke(monkeypatch, ledger, "runs", "--job", "cli_job")
    assert result.exit_code == 0, result.output
    header, *rows = result.output.strip().splitlines()
    assert header.split()[:5] == ["job", "run_id", "execution_id", "status", "started_at"]
    assert [r.split()[1] for r in rows] == ["ledger-2", "ledger-1"]
    assert rows[1].split()[3] == "completed_with_errors" and rows[0].split()[3] == "succeeded"
    only = json.loads(invoke(monkeypatch, ledger, "runs", "--run-id", "ledger-1", "--json").output)
    assert [(r["run_id"], r["succeeded_rows"], r["permanently_failed_rows"]) for r in only] == [("ledger-1", 36, 4)]
    failed = json.loads(invoke(monkeypatch, ledger, "runs", "--status", "completed_with_errors", "--json").output)
    assert [r["run_id"] for r in failed] == ["ledger-1"]


def test_runs_filter_by_an_external_id_they_sent(ledger, monkeypatch):
    sent = json.loads(invoke(monkeypatch, ledger, "runs", "--job", "cli_job", "--external-id",
                             "001000000000000:2025-10", "--json").output)
    assert [r["run_id"] for r in sent] == ["ledger-1"]  # the unchanged rerun sent nothing
    never = invoke(monkeypatch, ledger, "runs", "--external-id", "001999999999999:2025-01")
    assert never.exit_code == 0 and never.output.strip() == "no writeback runs match"


def test_records_filter_by_status_and_external_id(ledger, monkeypatch):
    result = invoke(monkeypatch, ledger, "records", "--job", "cli_job", "--status", "permanent_failed")
    assert result.exit_code == 0, result.output
    rows = result.output.strip().splitlines()[1:]
    assert len(rows) == 4 and all("FIELD_CUSTOM_VALIDATION_EXCEPTION" in r for r in rows)
    one = json.loads(invoke(monkeypatch, ledger, "records", "--external-id", "001000000000000:2025-10",
                            "--json").output)
    assert [(r["external_id"], r["status"], r["attempt_count"]) for r in one] == [
        ("001000000000000:2025-10", "permanent_failed", 1)]


def test_attempts_filter_by_run_and_external_id(ledger, monkeypatch):
    rows = json.loads(invoke(monkeypatch, ledger, "attempts", "--run-id", "ledger-1", "--json").output)
    assert len(rows) == 40 and {r["status"] for r in rows} == {"succeeded", "permanent_failed"}
    assert json.loads(invoke(monkeypatch, ledger, "attempts", "--run-id", "ledger-2", "--json").output) == []
    one = json.loads(invoke(monkeypatch, ledger, "attempts", "--external-id", "001000000000000:2025-10",
                            "--status", "permanent_failed", "--json").output)
    assert len(one) == 1 and one[0]["error_code"] == "FIELD_CUSTOM_VALIDATION_EXCEPTION"


def test_bad_filters_and_an_unreachable_ledger_are_one_line(ledger, monkeypatch):
    bad = invoke(monkeypatch, ledger, "records", "--status", "lost")
    assert bad.exit_code == 2 and "Invalid value for '--status'" in bad.output
    down = invoke(monkeypatch, "postgresql://nobody@127.0.0.1:9/nexus", "runs")
    assert down.exit_code == 1 and len(down.output.strip().splitlines()) == 1
    assert "cannot reach the control plane" in down.output
    empty = invoke(monkeypatch, ledger, "runs", "--job", "no_such_job")
    assert empty.exit_code == 0 and empty.output.strip() == "no writeback runs match"
