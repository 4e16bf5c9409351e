"""Seed 004 section 11's run exit policy, decided by JobResult.exit_code and reported
unchanged by the in-process `run-job` path."""

from __future__ import annotations

from nexus_pipelines.local.simulators.nexuscrm import FieldSpec, NexusCrmState
from nexus_pipelines.writeback.execute import run_in_process

from .support import dagster_resources, deploy, seed, write_config


def test_run_job_exit_code_follows_the_contract_for_blocking_failures(tmp_path, control_dsn, bq_emulator_url,
                                                                       bq_client):
    """A forced replay that hits the CRM unique conflict again reports it as blocking:
    the in-process `run-job` exit code agrees with JobResult.exit_code (section 11)."""
    state = deploy(NexusCrmState(), Account_External_Id__c=FieldSpec("Account_External_Id__c", length=18, unique=True))
    config_path = write_config(tmp_path, seed(bq_client, 24))
    resources = dagster_resources(control_dsn, bq_emulator_url, state)
    first = run_in_process("month_end_arr", config_path, resources=resources, run_id="blk-1")
    assert first.status == "completed_with_errors" and first.exit_code == 2
    forced = run_in_process("month_end_arr", config_path, resources=resources, run_id="blk-2", force=True)
    assert forced.status == "completed_with_errors" and forced.counts["new_permanent_failures"] == 0
    assert forced.counts["blocking_failures"] == 22
    assert forced.exit_code == 2
