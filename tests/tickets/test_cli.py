"""`actors ...` and `tickets triage|priority|acknowledge|rebuild` end to end: the credential is printed
once, read back only from NEXUS_ACTOR_CREDENTIAL or a hidden prompt, and every refusal is
one line that never repeats it."""

from __future__ import annotations

import re

from click.testing import CliRunner

from nexus_pipelines.cli import main
from nexus_pipelines.local.worlds.gitlab import PROJECT_ID, GitLabWorld
from nexus_pipelines.local.worlds.plant import Plant, accept, member
from tests.tickets.support import ingest, sweep_gap, version


def cli(env, *args, input=None):
    return CliRunner().invoke(main, list(args), env=env, input=input)


def test_actors_add_grant_and_decide_through_the_cli(pool, control_dsn):
    _, (first, second) = ingest(Plant(GitLabWorld(project_id=PROJECT_ID + 4000), pool), "cli-triage", 2)
    env = {"NEXUS_PG_DSN": control_dsn}
    added = cli(env, "actors", "add", "ada", "--name", "Ada L", "--project", "acme/cli-triage", "--role", "commander")
    assert added.exit_code == 0, added.output
    credential = re.search(r"^(npa\.\S+)$", added.output, re.M).group(1)
    refused = cli(env, "actors", "add", "bob", "--name", "Bob", "--project", "acme/typo", "--role", "operator")
    assert refused.exit_code == 1 and "no registration names project acme/typo" in refused.output
    assert "bob" not in cli(env, "actors", "list").output  # a refused grant issued no credential
    assert "ada\tAda L\tcredential issued" in cli(env, "actors", "list").output

    decider = {**env, "NEXUS_ACTOR_CREDENTIAL": credential}
    early = cli(decider, "tickets", "triage", str(first), "--disposition", "accepted", "--reason", "ok",
                "--expected-version", "1")
    assert early.exit_code == 1 and "only the automatic P2 from intake" in early.output
    set_p1 = ("tickets", "priority", str(first), "--priority", "p1", "--reason", "urgent", "--expected-version", "1",
              "--command-id", "cli-p1")
    done = cli(decider, *set_p1)
    assert done.exit_code == 0 and f"ticket {first}: UNTRIAGED at P1, open, version 2; command cli-p1" in done.output
    assert "replayed" in cli(decider, *set_p1).output
    again = cli(decider, "tickets", "priority", str(first), "--priority", "P1", "--reason", "still urgent",
                "--expected-version", "2")
    assert again.exit_code == 0 and "version 2;" in again.output and "(unchanged: already P1, nothing recorded)" \
        in again.output
    stale = cli(decider, "tickets", "triage", str(first), "--disposition", "accepted", "--reason", "ok",
                "--expected-version", "1")
    assert stale.exit_code == 1 and "is at version 2, not 1" in stale.output
    dup = cli(decider, "tickets", "triage", str(second), "--disposition", "duplicate", "--canonical", str(first),
              "--reason", "same report", "--expected-version", "1")
    assert dup.exit_code == 0 and "DUPLICATE at P2, cancelled" in dup.output
    shown = cli(env, "tickets", "show", str(second)).output
    assert f"duplicates ticket {first}" in shown and "connector_triage_required for the commander, resolved DUPLICATE" \
        in shown and "actor=ada, actor_role=commander, reason=same report" in shown
    assert "projection rebuilt from the facts: 0 ticket rows corrected" in cli(env, "tickets", "rebuild").output

    for outcome in (cli({**env, "NEXUS_ACTOR_CREDENTIAL": credential[:-3] + "abc"}, *set_p1),
                    cli(env, *set_p1, input="")):
        assert outcome.exit_code == 1 and len(outcome.output.strip().splitlines()) == 1
        assert credential not in outcome.output
    assert "actor credential is not valid" in cli({**env, "NEXUS_ACTOR_CREDENTIAL": "npa.x"}, *set_p1).output
    assert "export NEXUS_ACTOR_CREDENTIAL (or run in a terminal" in cli(env, *set_p1).output
    renewed = cli(env, "actors", "reissue", "ada")
    assert renewed.exit_code == 0 and credential not in renewed.output
    assert "not valid" in cli(decider, *set_p1).output  # the old credential stopped working


def test_a_commander_reads_a_sweep_gap_with_tickets_show_and_acknowledges_it(pool, control_dsn):
    plant = Plant(GitLabWorld(project_id=PROJECT_ID + 4100), pool)
    registration, (ticket,) = ingest(plant, "cli-gap", 1)
    with pool.connection() as conn:
        _, credential = member(conn, "acme/cli-gap", "commander")
        accept(conn, ticket)
    finding = sweep_gap(plant, registration, ticket)
    env = {"NEXUS_PG_DSN": control_dsn, "NEXUS_ACTOR_CREDENTIAL": credential}
    shown = cli(env, "tickets", "show", str(ticket))
    assert f"attention: finding {finding} connector_sweep_gap for the commander, unresolved" in shown.output
    with pool.connection() as conn:
        at = version(conn, ticket)
    done = cli(env, "tickets", "acknowledge", str(ticket), "--through-finding", str(finding), "--reason",
               "scan fixed", "--expected-version", str(at))
    assert done.exit_code == 0 and f"ticket {ticket}: ACCEPTED at P1, open, version {at + 1}" in done.output
    assert f"finding {finding} connector_sweep_gap for the commander, resolved ACKNOWLEDGED" in cli(
        env, "tickets", "show", str(ticket)).output
    again = cli(env, "tickets", "acknowledge", str(ticket), "--through-finding", str(finding), "--reason", "again",
                "--expected-version", str(at + 1))
    assert again.exit_code == 1 and "no unresolved sweep-gap finding" in again.output
