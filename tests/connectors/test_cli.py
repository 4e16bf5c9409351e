"""`nexus-pipelines connectors ...` and `tickets ...` end to end, and their one-line errors."""

from __future__ import annotations

import json

from click.testing import CliRunner

from nexus_pipelines.cli import main
from nexus_pipelines.local.simulators.gitlab import RateLimit
from tests.connectors.served import serve_gitlab
from nexus_pipelines.local.worlds.tokens import gitlab_token

TOKEN = gitlab_token("cli-test-0123456789abcdefghij")


def cli(env, *args):
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_activate_poll_drain_list_show_and_prove(tmp_path, control_dsn):
    served, stop = serve_gitlab(tmp_path, key="cli-served", token=TOKEN)
    env = {"NEXUS_PG_DSN": control_dsn, "NEXUS_CONNECTORS_DIR": str(served.folder), served.token_env: TOKEN}
    try:
        for n in range(3):
            served.state.add_issue(served.registration.provider.project_id, title=f"cli {n}")
        listed = cli(env, "connectors", "list")
        assert "acme/cli-served\tgitlab\tcli-served@" in listed.output and "Planner" in listed.output
        activated = cli(env, "connectors", "activate", "cli-served")
        assert activated.exit_code == 0 and "revision 1" in activated.output and "is active" in activated.output
        assert "already active" in cli(env, "connectors", "activate", "--all").output
        polled = cli(env, "connectors", "poll", "cli-served")
        assert polled.exit_code == 0 and "3 issues, 3 new versions" in polled.output and "routed 3" in polled.output
        assert json.loads(cli(env, "queue", "drain", "--registration", "acme/cli-served").output)["completed"] == 3
        status = cli(env, "connectors", "status", "cli-served")
        assert "tickets 3 (3 untriaged, 0 closed at source)" in status.output and "cursor gl1;" in status.output
        tickets = cli(env, "tickets", "list", "--registration", "acme/cli-served", "--json").output.splitlines()
        first = json.loads(tickets[0])
        assert len(tickets) == 3 and first["triage_state"] == "UNTRIAGED" and first["priority"] == "P2"
        added = cli(env, "actors", "add", "cli-commander", "--name", "Commander", "--project", "acme/served",
                    "--role", "commander")
        decider = {**env, "NEXUS_ACTOR_CREDENTIAL": added.output.split("\n")[2].strip()}
        ticket = str(first["ticket_id"])
        assert cli(decider, "tickets", "priority", ticket, "--priority", "P1", "--reason", "release blocker",
                   "--expected-version", "1").exit_code == 0
        assert cli(decider, "tickets", "triage", ticket, "--disposition", "accepted", "--reason", "confirmed",
                   "--expected-version", "2").exit_code == 0
        proved = cli(env, "tickets", "prove", str(first["ticket_id"]), "--evidence", "shipped", "--request-id", "r1")
        assert proved.exit_code == 0 and "close command close-" in proved.output
        again = cli(env, "tickets", "prove", str(first["ticket_id"]), "--evidence", "shipped", "--request-id", "r1")
        assert "was already recorded" in again.output
        cli(env, "queue", "drain", "--registration", "acme/cli-served")
        shown = cli(env, "tickets", "show", str(first["ticket_id"]))
        assert "status=delivered" in shown.output and "comment_ref=note:" in shown.output
    finally:
        stop()


def test_list_of_the_default_folder_names_the_subfolders_that_hold_registrations():
    listed = CliRunner().invoke(main, ["connectors", "list"], env={"NEXUS_CONNECTORS_DIR": None})
    assert listed.exit_code == 1
    line = listed.output.strip()
    assert len(line.splitlines()) == 1 and "configs/connectors" in line
    assert "examples/, local/ hold registration files" in line and "NEXUS_CONNECTORS_DIR" in line


def test_list_of_an_empty_or_missing_folder_says_so_in_one_line(tmp_path):
    empty = CliRunner().invoke(main, ["connectors", "list"], env={"NEXUS_CONNECTORS_DIR": str(tmp_path)})
    assert empty.exit_code == 1 and f"no registration files (*.yaml) directly in {tmp_path}; add one" in empty.output
    missing = CliRunner().invoke(main, ["connectors", "list"], env={"NEXUS_CONNECTORS_DIR": str(tmp_path / "nope")})
    assert missing.exit_code == 1 and "is not a folder; set NEXUS_CONNECTORS_DIR" in missing.output


def test_errors_are_one_line_and_name_what_to_do(tmp_path, control_dsn):
    env = {"NEXUS_PG_DSN": control_dsn, "NEXUS_CONNECTORS_DIR": str(tmp_path)}
    (tmp_path / "bad.yaml").write_text("key: bad\ntenant: acme\nproject: p\nkind: gitlab\nprovider:\n"
                                       "  base_url: https://gitlab.example.com\n  project_id: 1\n"
                                       f"  token: {gitlab_token('literal-token-value-0123456')}\n")
    refused = CliRunner().invoke(main, ["connectors", "list"], env=env)
    assert refused.exit_code == 1 and len(refused.output.strip().splitlines()) == 1
    assert "provider.token" in refused.output and "glpat-literal" not in refused.output
    (tmp_path / "bad.yaml").unlink()
    missing = CliRunner().invoke(main, ["tickets", "show", "999999"], env=env)
    assert missing.exit_code == 1 and "ticket 999999 does not exist" in missing.output
    down = CliRunner().invoke(main, ["tickets", "list"], env={"NEXUS_PG_DSN": "host=127.0.0.1 port=1 dbname=x "
                                                                             "user=u password=hunter2pw"})
    assert down.exit_code == 1 and "cannot reach the control plane at 127.0.0.1:1/x" in down.output
    assert "hunter2pw" not in down.output and len(down.output.strip().splitlines()) == 1
    assert "no single registration" in CliRunner().invoke(main, ["connectors", "poll", "nope"], env=env).output


def test_a_manual_poll_keeps_the_providers_known_wait_and_says_so_in_one_line(tmp_path, control_dsn):
    served, stop = serve_gitlab(tmp_path, key="cli-limited", token=TOKEN)
    env = {"NEXUS_PG_DSN": control_dsn, "NEXUS_CONNECTORS_DIR": str(served.folder), served.token_env: TOKEN}
    try:
        served.state.add_issue(served.registration.provider.project_id, title="limited")
        assert cli(env, "connectors", "activate", "cli-limited").exit_code == 0
        served.state.rate_limit = RateLimit(limit=0, window_s=3600)
        throttled = cli(env, "connectors", "poll", "cli-limited")
        assert "failure: throttled" in throttled.output and "0 pages" in throttled.output
        again = cli(env, "connectors", "poll", "cli-limited")
        (kept,) = [line for line in again.output.splitlines() if "keeps the provider's wait" in line]
        assert kept.startswith("acme/cli-limited: keeps the provider's wait until ") and "HTTP 429" in kept
        assert served.state.limited_calls == 0 and again.exit_code == 0  # nothing was sent into the limit
    finally:
        stop()
