from __future__ import annotations

import os
import subprocess
import sys

from nexus_pipelines.settings import PROJECT_ROOT


def test_the_full_definitions_load():
    from nexus_pipelines.definitions import defs

    repository = defs.get_repository_def()
    assert {"control_plane", "bigquery"} <= set(repository.get_top_level_resources())


def test_dagster_definitions_validate_passes_for_the_workspace(tmp_path):
    # An empty DAGSTER_HOME: without one, the CLI would pick up the production dagster.yaml in the
    # working directory, whose storage needs real credentials.
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "All code locations passed validation" in result.stdout + result.stderr


def test_the_production_instance_config_loads(tmp_path, monkeypatch):
    from dagster import DagsterInstance

    for name, value in {
        "DAGSTER_PG_USERNAME": "dagster",
        "DAGSTER_PG_PASSWORD": "unused",
        "DAGSTER_PG_HOST": "127.0.0.1",
        "DAGSTER_PG_DB": "dagster",
        "DAGSTER_PG_PORT": "5432",
    }.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "dagster.yaml").write_text((PROJECT_ROOT / "dagster.yaml").read_text())
    from dagster._core.instance.config import dagster_instance_config

    config, _ = dagster_instance_config(str(tmp_path))
    assert config["storage"]["postgres"]["postgres_db"]["hostname"] == {"env": "DAGSTER_PG_HOST"}
    limits = {limit["key"] for limit in config["concurrency"]["runs"]["tag_concurrency_limits"]}
    assert {"nexus/writeback-job", "nexus/queue-drain"} <= limits
    assert config["nux"] == {"enabled": False}  # no community pop-up in the UI
    assert DagsterInstance  # the config validated against Dagster's own schema above
