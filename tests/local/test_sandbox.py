"""The local stack's provider sandbox: the writeback runs from the launchpad's default config,
the trackers keep their data, and production never defaults to a local config."""

from __future__ import annotations

from nexus_pipelines.local.sandbox import Sandbox, environment, seed_source
from nexus_pipelines.writeback.execute import default_resources, run_in_process
from nexus_pipelines.writeback.registry import get_job
from tests.local.test_stack import free_ports


def test_the_launchpad_default_config_runs_the_writeback_on_the_local_stack(tmp_path, monkeypatch, control_dsn,
                                                                            bq_emulator_url):
    ports = free_ports()
    for name, value in {**environment(tmp_path, ports), "NEXUS_LOCAL_STACK": "1", "NEXUS_BQ_PROJECT": "nexus-local",
                        "NEXUS_BQ_EMULATOR_URL": bq_emulator_url}.items():
        monkeypatch.setenv(name, value)
    sandbox = Sandbox(tmp_path, ports)
    sandbox.serve()
    try:
        seed_source("nexus-local", bq_emulator_url)
        # what the launchpad submits when nobody edits it: no config_path, no canary, no dry run
        outcome = run_in_process("month_end_arr", None, resources=default_resources(control_dsn), log_level="CRITICAL")
    finally:
        sandbox.stop()
    assert outcome.job_name == "month_end_arr" and outcome.status == "completed_with_errors"
    assert (outcome.counts["succeeded"], outcome.counts["permanently_failed"]) == (2988, 12)
    assert len(sandbox.crm.records("Month_End_ARR__c")) == 2988


def test_production_defaults_to_the_production_config(monkeypatch):
    monkeypatch.delenv("NEXUS_LOCAL_STACK", raising=False)
    definition = get_job("month_end_arr")
    assert definition.default_config() == definition.config_path
    monkeypatch.setenv("NEXUS_LOCAL_STACK", "1")
    assert definition.default_config() == definition.local_config_path


def test_the_trackers_keep_their_data_and_the_app_key_between_sandboxes(tmp_path):
    first = Sandbox(tmp_path, free_ports())
    (gitlab, github, jira) = first.trackers
    gitlab.state.update_issue(278964, 1, title="changed while served")
    first.stop()
    key = environment(tmp_path)["NEXUS_DEMO_GITHUB_APP_KEY"]
    again = Sandbox(tmp_path, free_ports())
    assert again.trackers[0].state.issue(278964, 1).title == "changed while served"
    assert environment(tmp_path)["NEXUS_DEMO_GITHUB_APP_KEY"] == key and "PRIVATE KEY" in key
    assert (tmp_path / "simulators" / "github-app-key.pem").stat().st_mode & 0o077 == 0
