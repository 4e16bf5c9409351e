from __future__ import annotations

import os
import subprocess
import sys

from nexus_pipelines.settings import PROJECT_ROOT


def test_the_full_definitions_load():
    from nexus_pipelines.definitions import defs

    repository = defs.get_repository_def()
    assert {"control_plane", "bigquery"} <= set(repository.get_top_level_resources())


def test_the_warehouse_is_dagster_gcps_bigquery_resource_with_its_project_and_location(monkeypatch):
    from dagster_gcp import BigQueryResource

    from nexus_pipelines.definitions import build_resources

    monkeypatch.setenv("NEXUS_BQ_PROJECT", "analytics-prod")
    monkeypatch.setenv("NEXUS_BQ_LOCATION", "EU")
    monkeypatch.delenv("NEXUS_BQ_EMULATOR_URL", raising=False)
    warehouse = build_resources()["bigquery"]
    assert isinstance(warehouse, BigQueryResource)  # what the UI's resource page shows and users configure
    assert (warehouse.project, warehouse.location, warehouse.emulator_url) == ("analytics-prod", "EU", None)


def test_a_plain_dagster_definitions_validate_passes_at_the_repository_root():
    # No DAGSTER_HOME and no instance file in the root: the CLI uses an ephemeral instance (the
    # production instance lives in deploy/ and needs the production Postgres).
    env = {name: value for name, value in os.environ.items() if name != "DAGSTER_HOME"}
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
