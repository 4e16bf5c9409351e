from __future__ import annotations

import json
from datetime import timedelta

from click.testing import CliRunner

from nexus_pipelines.cli import main
from nexus_pipelines.workqueue import claims
from nexus_pipelines.workqueue.receipts import enqueue_work_items

from .conftest import items


def run(dsn, *args):
    result = CliRunner().invoke(main, ["queue", *args], env={"NEXUS_PG_DSN": dsn}, catch_exceptions=False)
    return result


def registered(conn, key: str, revisions: int = 1) -> str:
    """A connector registration with `revisions` revisions: generations the queue's commands may name."""
    from nexus_pipelines.connectors.core import store
    from nexus_pipelines.local.worlds.gitlab import GitLabWorld

    world = GitLabWorld()
    for n in range(revisions):
        registration = world.registration(key=key, page_size=10 + n)
        store.register(conn, registration)
    return registration.registration_id


def enqueue(conn, reg: str, work):
    return enqueue_work_items(conn, work, registration_id=reg, revision=1, route_id="issue.close")


def test_queue_commands_end_to_end(control_conn, control_dsn, reg):
    reg = registered(control_conn, reg, revisions=2)
    enqueue(control_conn, reg, items(3, "cli.test"))
    out = run(control_dsn, "activate", reg, "1", "--route", "issue.close=1")
    assert out.exit_code == 0 and "is active" in out.output
    assert run(control_dsn, "activate", reg, "2").exit_code != 0  # revision 1 is active: refused
    (item,) = claims.claim_batch(control_conn, owner="w", limit=1, lease_ttl=timedelta(seconds=30), registration_ids=[reg])
    claims.fail(control_conn, item, "Rejected", "no")
    listing = run(control_dsn, "dlq", "list", "--registration", reg)
    assert str(item.work_id) in listing.output and "Rejected" in listing.output
    stats = run(control_dsn, "stats", "--json")
    health = json.loads(stats.output)
    assert health["dead"] >= 1 and "depth_by_queue_class" in health
    replayed = run(control_dsn, "replay", str(item.work_id))
    assert replayed.exit_code == 0 and "pending again" in replayed.output
    refused = run(control_dsn, "replay", str(item.work_id))
    assert refused.exit_code != 0 and "replay refused" in refused.output
    drained = run(control_dsn, "drain", "--registration", reg, "--time-budget", "5")
    assert drained.exit_code == 0 and json.loads(drained.output.splitlines()[-1])["claimed"] == 0  # nothing registered
    quiesced = run(control_dsn, "quiesce", reg, "1")
    assert quiesced.exit_code == 0 and "drained" in quiesced.output
    assert run(control_dsn, "activate", reg, "2").exit_code == 0


def _one_line_error(result, starts: str) -> str:
    """The refusal: exit 1, its last line the only error line, and no traceback."""
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    assert errors == [lines[-1]] and lines[-1].startswith(f"Error: {starts}"), result.output
    assert "Traceback" not in result.output
    return lines[-1]


def test_rollback_fences_and_recutover_from_the_cli(control_conn, control_dsn, reg, monkeypatch):
    from nexus_pipelines import bindings
    from nexus_pipelines.workqueue.handlers import HandlerRegistry

    reg = registered(control_conn, reg)
    enqueue(control_conn, reg, items(3, "cli.test"))
    assert run(control_dsn, "activate", reg, "1").exit_code == 0
    (running,) = claims.claim_batch(control_conn, owner="w", limit=1, lease_ttl=timedelta(seconds=30),
                                    registration_ids=[reg])

    refused = run(control_dsn, "rollback", reg, "1")
    line = _one_line_error(refused, "rollback fence refused")
    assert f"work item {running.work_id} blocks the rollback (running" in line
    assert "work item claims and reclaims are disabled" in refused.output
    claims.complete(control_conn, [running.fence])
    rolled = run(control_dsn, "rollback", reg, "1")
    assert rolled.exit_code == 0 and "Event-owned: 2 work items fenced" in rolled.output

    listing = run(control_dsn, "fences", "--registration", reg)
    assert "fenced=2\tawaiting=2\tunknown=0\treconciled=0" in listing.output
    _one_line_error(run(control_dsn, "recutover", reg, "1"), "re-cutover refused")
    health = json.loads(run(control_dsn, "stats", "--json").output)
    assert health["fences"]["awaiting_legacy_outcome"] >= 2 and health["generations"]["event"]["quiescing"] >= 1

    # the Event path resumes and runs the fenced work with the code location's registry
    assert run(control_dsn, "activate", reg, "1", "--event-path").exit_code == 0
    monkeypatch.setattr(bindings, "build_handler_registry", lambda pool: HandlerRegistry({"cli.test": lambda i: "ok"}))
    drained = run(control_dsn, "event-drain", reg, "1", "--time-budget", "10")
    report = json.loads(drained.output.splitlines()[-1])
    assert (report["completed"], report["reconciled"]) == (2, 2)
    cut = run(control_dsn, "recutover", reg, "1")
    assert cut.exit_code == 0 and "2 fenced items reconciled, 0 new work items" in cut.output
    assert "fenced=2\tawaiting=0\tunknown=0\treconciled=2" in run(control_dsn, "fences").output
    _one_line_error(run(control_dsn, "fences", "confirm", str(running.work_id), "--outcome", "succeeded"),
                    "confirmation refused")
    _one_line_error(run(control_dsn, "recutover", reg, "1"), "re-cutover refused")  # not Event-owned any more


def test_generations_and_routes_the_code_location_does_not_know_are_refused(control_conn, control_dsn, reg):
    known = registered(control_conn, reg)
    hostile = "reg'); DROP TABLE leases; --"
    refused = run(control_dsn, "activate", hostile, "1")
    line = _one_line_error(refused, "unknown generation")
    assert f"{known}@1" in line or "..." in line
    _one_line_error(run(control_dsn, "activate", known, "7"), "unknown generation")
    _one_line_error(run(control_dsn, "activate", known, "1", "--route", "bulk=1"), "--route 'bulk=1' is not a route")
    _one_line_error(run(control_dsn, "quiesce", hostile, "1"), "unknown generation")
    assert control_conn.execute("SELECT count(*) FROM workqueue_generations WHERE registration_id = %s",
                                (hostile,)).fetchone() == (0,)
    assert control_conn.execute("SELECT to_regclass('leases')").fetchone() != (None,)


def _older_binary_receipt(conn, work_id: int) -> None:
    """A succeeded LegacyOutcomeReceipt written for `work_id` outside the gates (as an older
    Event-path binary that kept running would), its execution left as it was."""
    from nexus_pipelines.workqueue import legacy_outcomes

    row = conn.execute("SELECT event_id, work_type, registration_id, revision, rollback_fence_id FROM event_executions"
                       " WHERE work_id = %s", (work_id,)).fetchone()
    with conn.transaction():
        legacy_outcomes.record(conn, legacy_outcomes.Execution(work_id, *row), "succeeded", token=None, detail={},
                               recorded_by="older-binary")


def test_a_database_guard_refusing_the_recutover_is_one_line(control_conn, control_dsn, reg):
    reg = registered(control_conn, reg)
    enqueue(control_conn, reg, items(1, "cli.test"))
    assert run(control_dsn, "activate", reg, "1").exit_code == 0
    assert run(control_dsn, "rollback", reg, "1").exit_code == 0
    (work_id,) = control_conn.execute("SELECT work_id FROM event_executions WHERE registration_id = %s",
                                      (reg,)).fetchone()
    _older_binary_receipt(control_conn, work_id)  # its fenced item projects as reconciled; the execution is pending

    line = _one_line_error(run(control_dsn, "recutover", reg, "1"), "re-cutover refused by the database: ")
    assert line.endswith("cannot be WorkItem-owned while it has unfinished or unconfirmed Event executions; "
                         f"the cutover was rolled back (`queue activate {reg} 1 --event-path` resumes its Event path)")
    assert control_conn.execute("SELECT state FROM connector_work_items WHERE work_id = %s", (work_id,)).fetchone() == (
        "awaiting_legacy_outcome",)


def test_a_database_guard_refusing_the_rollback_fence_is_one_line(control_conn, control_dsn, reg):
    from nexus_pipelines.workqueue import event_path
    from nexus_pipelines.workqueue.handlers import HandlerRegistry

    reg = registered(control_conn, reg)
    enqueue(control_conn, reg, items(1, "cli.test"))
    assert run(control_dsn, "activate", reg, "1").exit_code == 0
    assert run(control_dsn, "rollback", reg, "1").exit_code == 0
    event_path.run_event_path(control_dsn, HandlerRegistry({"cli.test": lambda i: "ok"}), reg, 1)
    enqueue(control_conn, reg, items(1, "cli.test"))  # Event-owned: an execution, handed over at the re-cutover
    assert run(control_dsn, "recutover", reg, "1").exit_code == 0
    (transferred,) = control_conn.execute(
        "SELECT work_id FROM event_executions WHERE registration_id = %s AND state = 'transferred'", (reg,)).fetchone()
    _older_binary_receipt(control_conn, transferred)

    refused = run(control_dsn, "rollback", reg, "1")
    line = _one_line_error(refused, "rollback fence refused by the database: ")
    assert f"event execution {transferred} " in line and "LegacyOutcomeReceipt" in line
    assert line.endswith(f"nothing was fenced (`queue activate {reg} 1` resumes its claims)")
    assert control_conn.execute("SELECT state FROM connector_work_items WHERE work_id = %s",
                                (transferred,)).fetchone() == ("pending",)


def test_any_other_database_error_in_a_gate_command_is_a_bug_and_keeps_its_traceback(
    control_conn, control_dsn, reg, monkeypatch
):
    import psycopg
    import pytest

    from nexus_pipelines.workqueue import rollback

    def broken(*args, **kwargs):
        raise psycopg.errors.UniqueViolation("duplicate key value violates unique constraint")

    reg = registered(control_conn, reg)
    enqueue(control_conn, reg, items(1, "cli.test"))
    assert run(control_dsn, "activate", reg, "1").exit_code == 0
    monkeypatch.setattr(rollback, "fence", broken)
    with pytest.raises(psycopg.errors.UniqueViolation):
        run(control_dsn, "rollback", reg, "1")
