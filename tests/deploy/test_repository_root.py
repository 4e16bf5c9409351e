"""At the repository root, a plain `dagster dev` serves the code location: the root holds no
instance file (the production one, deploy/dagster.yaml, needs the production Postgres)."""

from __future__ import annotations

import os
import shutil

import pytest

from .support import BIN, PROJECT_ROOT, Service, Webserver, free_port, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_plain_dagster_dev_at_the_repository_root_serves_the_code_location(tmp_path):
    assert not (PROJECT_ROOT / "dagster.yaml").exists()
    port = free_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith(("DAGSTER_", "NEXUS_"))}
    before = set(PROJECT_ROOT.glob(".tmp_dagster_home_*"))
    dev = Service("dagster-dev", [str(BIN / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(port)], cwd=PROJECT_ROOT,
                  env=env, log_dir=tmp_path).start()
    webserver = Webserver(port)
    try:
        wait_for(lambda: webserver.serving() or not dev.alive(), "dagster dev to serve the code location", 300, 2)
        assert dev.alive(), dev.tail()
        assert webserver.location()["name"] == "nexus_pipelines"
    finally:
        dev.stop()
        for leftover in set(PROJECT_ROOT.glob(".tmp_dagster_home_*")) - before:  # its temporary instance
            shutil.rmtree(leftover, ignore_errors=True)
