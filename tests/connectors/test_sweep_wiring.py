"""The reconciliation sweep through the code location's Definitions (its check, job and
schedule) and through `nexus-pipelines connectors sweep`, over a GitLab served on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from click.testing import CliRunner
from dagster import AssetCheckKey, AssetCheckSeverity, DagsterInstance, DefaultScheduleStatus, Definitions

from nexus_pipelines.cli import main
from nexus_pipelines.connectors.core import activation
from nexus_pipelines.connectors.registry import REGISTRY, load_registrations
from nexus_pipelines.tickets.assets import tickets_asset_key
from nexus_pipelines.tickets.definitions import build_ticket_defs
from nexus_pipelines.tickets.sweep_checks import SWEEP_CHECK, SWEEP_JOB, SWEEP_SCHEDULE
from nexus_pipelines.control.resources import ControlPlaneResource
from nexus_pipelines.tickets.handlers import route_versions
from tests.connectors.served import serve_gitlab
from nexus_pipelines.local.worlds.tokens import gitlab_token
from nexus_pipelines.settings import PROJECT_ROOT

TOKEN = gitlab_token("sweep-wiring-0123456789abcdef")


@pytest.fixture
def served(tmp_path, monkeypatch, control_dsn, request):
    gitlab, stop = serve_gitlab(tmp_path, key=f"sweep-{abs(hash(request.node.name)) % 10**6}", token=TOKEN)
    monkeypatch.setenv(gitlab.token_env, TOKEN)
    monkeypatch.setenv("NEXUS_CONNECTORS_DIR", str(gitlab.folder))
    monkeypatch.setenv("NEXUS_PG_DSN", control_dsn)
    yield gitlab
    stop()


def _synced_with_one_missed(served, pool) -> None:
    """Three issues polled and applied, then one stamped before the scans' bound (never polled)."""
    project = served.registration.provider.project_id
    for n in range(3):
        served.state.add_issue(project, title=f"seen {n}")
    with pool.connection() as conn:
        activation.activate(conn, served.registration, REGISTRY, recorded_by="test", route_versions=route_versions(),
                            drain_old=lambda *_: None)
    runner = CliRunner()
    assert runner.invoke(main, ["connectors", "poll", served.registration.key]).exit_code == 0
    assert runner.invoke(main, ["queue", "drain", "--registration", served.registration.registration_id]).exit_code == 0
    served.state.add_issue(project, title="never polled", updated_at=served.state.clock.now() - timedelta(days=2))


def test_the_sweep_cli_prints_one_line_with_listed_gaps_reobserved_and_calls(served, pool):
    _synced_with_one_missed(served, pool)
    result = CliRunner().invoke(main, ["connectors", "sweep", "--key", served.registration.key])
    assert result.exit_code == 0, result.output
    assert result.output == (f"{served.registration.registration_id} sweep complete: listed 4, gaps 1, "
                             "re-observed 1, calls 2, unchanged pages 0\n")
    again = CliRunner().invoke(main, ["connectors", "sweep", "--key", served.registration.key])
    assert "gaps 0, re-observed 0, calls 1" in again.output  # the gap's receipt is on its way: not missed twice


def test_the_sweep_job_of_the_definitions_warns_on_a_gap_and_observes_the_tickets_asset(served, pool, control_dsn):
    _synced_with_one_missed(served, pool)
    other = (served.folder / f"{served.registration.key}.yaml").read_text().replace(served.registration.key, "other")
    (served.folder / "other.yaml").write_text(other)  # a second registration the launched run does not sweep
    defs = Definitions.merge(Definitions(resources={"control_plane": ControlPlaneResource(dsn=control_dsn)}),
                             build_ticket_defs(load_registrations(served.folder)))
    rid = served.registration.registration_id
    schedule = defs.get_schedule_def(SWEEP_SCHEDULE)
    assert schedule.default_status == DefaultScheduleStatus.RUNNING and schedule.job_name == SWEEP_JOB
    checks = defs.get_repository_def().asset_graph.asset_check_keys
    assert {AssetCheckKey(tickets_asset_key(r), SWEEP_CHECK) for r in (rid, "acme/other")} <= checks

    result = defs.resolve_job_def(SWEEP_JOB).execute_in_process(
        instance=DagsterInstance.ephemeral(),
        run_config={"ops": {"connectors_sweep_check": {"config": {"registrations": [served.registration.key]}}}})
    assert result.success
    (evaluation,) = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert evaluation.check_name == SWEEP_CHECK and not evaluation.passed
    assert evaluation.severity == AssetCheckSeverity.WARN
    assert evaluation.description == "missed by incremental scans: 1"
    (observation,) = [e.event_specific_data.asset_observation for e in result.all_events
                      if e.event_type_value == "ASSET_OBSERVATION"]
    assert observation.asset_key == tickets_asset_key(rid)
    assert observation.metadata["sweep_missed"].value == 1 and observation.metadata["sweep_listed"].value == 4


def _loaded_sweep_wiring(connectors_dir) -> dict:
    """The sweep's schedule and job as the code location loads them (a fresh process: the
    Definitions read NEXUS_CONNECTORS_DIR when imported)."""
    probe = """if True:
        import json
        from nexus_pipelines.definitions import defs
        repository = defs.get_repository_def()
        print(json.dumps({"schedules": {s.name: s.default_status.value for s in repository.schedule_defs},
                          "jobs": sorted(j.name for j in repository.get_all_jobs())}))"""
    env = {**os.environ, "NEXUS_CONNECTORS_DIR": str(connectors_dir), "PYTHONPATH": str(PROJECT_ROOT)}
    result = subprocess.run([sys.executable, "-c", probe], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_the_loaded_definitions_run_the_daily_sweep_by_default_once_there_are_registrations():
    loaded = _loaded_sweep_wiring(PROJECT_ROOT / "configs" / "connectors" / "examples")
    assert loaded["schedules"][SWEEP_SCHEDULE] == "RUNNING" and SWEEP_JOB in loaded["jobs"]


def test_the_loaded_definitions_without_registrations_have_no_sweep_to_run(tmp_path):
    loaded = _loaded_sweep_wiring(tmp_path)
    assert SWEEP_SCHEDULE not in loaded["schedules"] and SWEEP_JOB not in loaded["jobs"]


def test_the_scheduled_sweep_of_a_registration_nobody_activated_passes_without_a_provider_call(served, control_dsn):
    defs = Definitions.merge(Definitions(resources={"control_plane": ControlPlaneResource(dsn=control_dsn)}),
                             build_ticket_defs(load_registrations(served.folder)))
    before = dict(served.state.calls)
    result = defs.resolve_job_def(SWEEP_JOB).execute_in_process(instance=DagsterInstance.ephemeral())
    assert result.success
    (evaluation,) = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert evaluation.passed and evaluation.description.startswith("not swept: revision ")
    assert dict(served.state.calls) == before  # nothing asked of the provider
