"""The run exit policy (docs/design/writeback-run.md, "Exit codes"), decided by JobResult.exit_code and reported
unchanged by the in-process `run-job` path."""

from __future__ import annotations

from nexus_pipelines.local.simulators.nexuscrm import FieldSpec, NexusCrmState
from nexus_pipelines.writeback.execute import run_in_process

from .support import dagster_resources, deploy, seed, write_config


def test_run_job_exit_code_follows_the_contract_for_blocking_failures(tmp_path, control_dsn, bq_emulator_url,
                                                                       bq_client):
    """A forced replay that hits the CRM unique conflict again reports it as blocking:
    the in-process `run-job` exit code agrees with JobResult.exit_code."""
    state = deploy(NexusCrmState(), Account_External_Id__c=FieldSpec("Account_External_Id__c", length=18, unique=True))
    config_path = write_config(tmp_path, seed(bq_client, 24))
    resources = dagster_resources(control_dsn, bq_emulator_url, state)
    first = run_in_process("month_end_arr", config_path, resources=resources, run_id="blk-1")
    assert first.status == "completed_with_errors" and first.exit_code == 2
    forced = run_in_process("month_end_arr", config_path, resources=resources, run_id="blk-2", force=True)
    assert forced.status == "completed_with_errors" and forced.counts["new_permanent_failures"] == 0
    assert forced.counts["blocking_failures"] == 22
    assert forced.exit_code == 2


def test_in_process_runs_report_the_exit_code_the_job_result_decides(tmp_path, control_dsn, bq_emulator_url,
                                                                      bq_client, monkeypatch):
    """One rule: JobResult.exit_code. The in-process path (and so the CLI) carries it
    through Dagster unchanged instead of recomputing it from the run's metadata."""
    from nexus_pipelines.writeback.contract import JobResult

    from .support import new_state

    monkeypatch.setattr(JobResult, "exit_code", property(lambda self: 7 if self.status == "succeeded" else 9))
    resources = dagster_resources(control_dsn, bq_emulator_url, new_state())
    ok = run_in_process("month_end_arr", write_config(tmp_path, seed(bq_client, 12)), resources=resources)
    assert (ok.status, ok.exit_code) == ("succeeded", 7)
    failed = run_in_process("month_end_arr", write_config(tmp_path, "no_such_dataset"), resources=resources)
    assert (failed.status, failed.exit_code) == ("failed", 9)


def test_in_process_runs_show_under_the_writeback_jobs_name(tmp_path, control_dsn, bq_emulator_url, bq_client):
    from dagster import DagsterInstance

    from .support import new_state

    instance = DagsterInstance.ephemeral()
    outcome = run_in_process("month_end_arr", write_config(tmp_path, seed(bq_client, 12)), instance=instance,
                             resources=dagster_resources(control_dsn, bq_emulator_url, new_state()))
    assert instance.get_run_by_id(outcome.dagster_run_id).job_name == "writeback_month_end_arr_job"
