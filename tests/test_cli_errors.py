"""Every command that needs the control plane fails fast with one line when it is down, or
when NEXUS_PG_DSN is unset (only `local` and `demo` fall back to the embedded server)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from nexus_pipelines.cli import main

DOWN = {"NEXUS_PG_DSN": "host=127.0.0.1 port=1 dbname=nexus user=u password=pw-not-printed"}


CONTROL_PLANE_COMMANDS = [
    ["migrate"], ["queue", "stats"], ["queue", "dlq", "list"], ["queue", "drain", "--time-budget", "1"],
    ["queue", "replay", "1"], ["connectors", "status"], ["tickets", "list"], ["writeback", "runs"],
]


@pytest.mark.parametrize("args", CONTROL_PLANE_COMMANDS)
def test_an_unreachable_control_plane_is_one_line_naming_it(args):
    result = CliRunner().invoke(main, args, env=DOWN)
    assert result.exit_code == 1, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "127.0.0.1:1/nexus" in result.output and "pw-not-printed" not in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("args", CONTROL_PLANE_COMMANDS)
def test_an_unset_control_plane_dsn_is_one_line_naming_local_up(args):
    result = CliRunner().invoke(main, args, env={"NEXUS_PG_DSN": None})
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [result.output.strip()]
    assert result.output.startswith("Error: NEXUS_PG_DSN is not set: run `nexus-pipelines local up`")
