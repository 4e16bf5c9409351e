"""The local stack's provider sandbox: the writeback runs from the launchpad's default config,
its source stays fresh for as long as the stack runs, the trackers keep their data, and
production never defaults to a local config."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from nexus_pipelines.integrations.bigquery import make_bigquery_client
from nexus_pipelines.local.pidfile import PidFile
from nexus_pipelines.local.postgres import StackError
from nexus_pipelines.local.simulators.http import serve_in_thread
from nexus_pipelines.local.sandbox import (
    SOURCE_DATASET,
    Sandbox,
    SandboxProcess,
    environment,
    keep_source_fresh,
    seed_source,
)
from nexus_pipelines.writeback.config import load_config
from nexus_pipelines.writeback.execute import default_resources, run_in_process
from nexus_pipelines.local.month_end_arr_source import mark_load
from nexus_pipelines.writeback.registry import get_job
from nexus_pipelines.writeback.source import freshness_problem, run_readiness

from .support import free_ports


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


def stale_problem(emulator_url: str) -> str | None:
    """What the launchpad run's source_fresh check would say now (None: it passes)."""
    loaded = load_config(get_job("month_end_arr").local_config_path)
    client = make_bigquery_client("nexus-local", "US", emulator_url)
    try:
        readiness = run_readiness(client, loaded.readiness_sql())
    finally:
        client.close()
    return freshness_problem(readiness, loaded.config.source.freshness_max_age_minutes, datetime.now(UTC))


def age_the_load(emulator_url: str) -> None:
    client = make_bigquery_client("nexus-local", "US", emulator_url)
    try:
        mark_load(client, SOURCE_DATASET, load_run_id="local-old", finished_at=datetime.now(UTC) - timedelta(hours=4))
    finally:
        client.close()
    assert "older than freshness_max_age_minutes=180" in stale_problem(emulator_url)


def test_up_on_a_running_sandbox_marks_a_stale_source_load_fresh_again(tmp_path, bq_emulator_url):
    sandbox = SandboxProcess(tmp_path, free_ports())
    sandbox.start(bq_project="nexus-local", emulator_url=bq_emulator_url)
    try:
        assert stale_problem(bq_emulator_url) is None
        age_the_load(bq_emulator_url)  # the stack has run for 4 hours
        sandbox.start(bq_project="nexus-local", emulator_url=bq_emulator_url)  # what `local up` does then
        assert sandbox.running() and stale_problem(bq_emulator_url) is None
    finally:
        sandbox.stop()


def test_the_running_sandbox_marks_its_source_load_fresh_again_on_its_own(bq_emulator_url):
    seed_source("nexus-local", bq_emulator_url)
    age_the_load(bq_emulator_url)
    stop = threading.Event()
    marker = threading.Thread(target=keep_source_fresh, args=("nexus-local", bq_emulator_url, stop),
                              kwargs={"every_s": 0.2}, daemon=True)
    marker.start()
    try:
        deadline = time.monotonic() + 60
        while stale_problem(bq_emulator_url) is not None:
            assert time.monotonic() < deadline, "the sandbox never marked its load again"
            time.sleep(0.2)
    finally:
        stop.set()
        marker.join(30)


def test_up_fails_in_one_line_naming_a_port_another_process_serves(tmp_path, bq_emulator_url):
    ports = free_ports()
    squatter = Sandbox(tmp_path / "other", ports)  # another stack's GitLab answers on our GitLab port
    _, stop_squatter = serve_in_thread(squatter.trackers[0].app, port=ports[1])
    sandbox = SandboxProcess(tmp_path / "stack", ports)
    try:
        with pytest.raises(StackError) as error:
            sandbox.start(bq_project="nexus-local", emulator_url=bq_emulator_url, timeout_s=30)
    finally:
        stop_squatter()
        sandbox.stop()
    message = str(error.value)
    assert "\n" not in message
    assert f"port {ports[1]} is held by pid {os.getpid()} (" in message
    assert not sandbox.running() and not (tmp_path / "stack" / "sandbox.pid").exists()



def test_a_live_recorded_process_is_not_running_while_others_serve_its_ports(tmp_path):
    ports = free_ports()
    others = Sandbox(tmp_path / "other", ports)  # another checkout's `make demo` on the same ports
    others.serve()
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sandbox = SandboxProcess(tmp_path / "stack", ports)
    try:
        (tmp_path / "stack").mkdir()
        PidFile(tmp_path / "stack" / "sandbox.pid").record(stranger.pid)  # alive, but it serves nothing
        assert not sandbox.running()
    finally:
        others.stop()
        stranger.kill()
        stranger.wait()
