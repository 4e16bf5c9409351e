"""Every command that needs the control plane fails fast with one line when it is down."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from nexus_pipelines.cli import main

DOWN = {"NEXUS_PG_DSN": "host=127.0.0.1 port=1 dbname=nexus user=u password=pw-not-printed"}


@pytest.mark.parametrize("args", [
    ["migrate"], ["queue", "stats"], ["queue", "dlq", "list"], ["queue", "drain", "--time-budget", "1"],
    ["queue", "replay", "1"], ["connectors", "status"], ["tickets", "list"], ["writeback", "runs"],
])
def test_an_unreachable_control_plane_is_one_line_naming_it(args):
    result = CliRunner().invoke(main, args, env=DOWN)
    assert result.exit_code == 1, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "127.0.0.1:1/nexus" in result.output and "pw-not-printed" not in result.output
    assert "Traceback" not in result.output
