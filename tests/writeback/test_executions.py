"""Executions of a writeback run: each keeps its own run row (the run id groups them), and
an execution whose control-plane session died while it held the job lease is found dead
by the next one, which takes the lease over and marks it abandoned (real Postgres, the
emulator, the simulator)."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import psycopg
from click.testing import CliRunner

from nexus_pipelines.cli import main

from .support import context, crm_factory, job, make_config, seed


def killed_after_upsert(state, admin: psycopg.Connection, victim, calls: int):
    """CRM clients whose upsert number `calls` is answered, then the control-plane sessions of
    `victim()` (a runner: its own and its commit thread's) are terminated before the batch is
    recorded. The batches before it are recorded first (their commits may still be running
    while this upsert is sent)."""
    sent = [0]

    def factory(loaded):
        client = crm_factory(state)(loaded)
        upsert = client.upsert_batch

        def upsert_batch(*args, **kwargs):
            sent[0] += 1
            if sent[0] == calls:
                _wait_for_batches(admin, victim(), calls - 1)
            outcome = upsert(*args, **kwargs)
            if sent[0] == calls:
                for ledger in (victim().ledger, victim().ledger_writer):
                    admin.execute("SELECT pg_terminate_backend(%s)", (ledger.conn.info.backend_pid,))
            return outcome

        client.upsert_batch = upsert_batch
        return client

    return factory


def _wait_for_batches(admin: psycopg.Connection, runner, batches: int) -> None:
    for _ in range(500):
        row = admin.execute("SELECT batches FROM outbound_runs WHERE execution_id = %s",
                            (runner.execution_id,)).fetchone()
        if row and row[0] >= batches:
            return
        time.sleep(0.01)
    raise AssertionError(f"{batches} batches were never recorded")


def test_an_execution_whose_session_died_is_abandoned_and_its_unrecorded_rows_are_sent_again(
        bq_client, make_runner, sim_state, control_conn):
    config, name = make_config(seed(bq_client, 30), batch_size=10), job()
    first = make_runner(config, sim_state, job_name=name)
    first.crm_factory = killed_after_upsert(sim_state, control_conn, lambda: first, calls=2)
    died = first.run(context("dies"))
    assert died.status == "failed" and died.succeeded == 10  # batch 2 reached the CRM, not the ledger
    # The dead runner's connection is gone: read with another.
    (status, lease_until) = control_conn.execute(
        "SELECT r.status, l.expires_at FROM outbound_runs r JOIN leases l ON l.fencing_token = r.lease_token "
        "WHERE r.job_name = %s AND r.run_id = 'dies'", (name,)).fetchone()
    assert status == "running" and lease_until > control_conn.execute("SELECT clock_timestamp()").fetchone()[0]

    rerun = make_runner(config, sim_state, job_name=name)
    result = rerun.run(context("next"))
    assert result.status == "succeeded" and result.succeeded == 20  # batches 2 and 3, nothing recorded twice
    assert result.took_over == (
        f"took over the {name} lease and marked run dies execution {first.execution_id} abandoned: its "
        f"control-plane session ended while it held the lease (until {lease_until:%Y-%m-%d %H:%M:%S} UTC); "
        "the rows it did not record stay retryable")
    abandoned = rerun.ledger.run_row("dies")
    assert (abandoned["status"], abandoned["succeeded_rows"], abandoned["batches"]) == ("abandoned", 10, 1)
    assert abandoned["error_message"].startswith("abandoned: its control-plane session ended while it held the lease")
    assert {r["status"] for r in rerun.ledger.record_rows()} == {"succeeded"}
    assert len(rerun.ledger.record_rows()) == 30


def test_a_holder_whose_session_is_alive_keeps_its_unexpired_lease(bq_client, make_runner, sim_state):
    config, name = make_config(seed(bq_client, 10)), job()
    holder = make_runner(config, sim_state, job_name=name)
    lease = holder.ledger.acquire_lease("alive", timedelta(minutes=5))
    holder.ledger.start_run("alive", dry_run=False, options={}, lease_token=lease.token)
    other = make_runner(config, sim_state, job_name=name)
    result = other.run(context("other"))
    assert result.status == "skipped_already_running" and result.lease_holder.alive
    assert other.ledger.run_row("alive")["status"] == "running"
    holder.ledger.release_lease(lease)


def test_replaying_a_finished_run_id_keeps_each_executions_row(bq_client, make_runner, sim_state, control_dsn,
                                                              monkeypatch):
    config, name = make_config(seed(bq_client, 30), batch_size=10), job()
    first = make_runner(config, sim_state, job_name=name)
    assert first.run(context("replayed")).succeeded == 30
    replay = make_runner(config, sim_state, job_name=name)
    assert replay.run(context("replayed")).unchanged == 30
    rows = replay.ledger.executions("replayed")
    assert [(r["execution_id"], r["status"], r["succeeded_rows"], r["batches"], r["crm_calls"]) for r in rows] == [
        (first.execution_id, "succeeded", 30, 3, 3), (replay.execution_id, "succeeded", 0, 0, 0)]

    monkeypatch.setenv("NEXUS_PG_DSN", control_dsn)
    listed = json.loads(CliRunner().invoke(main, ["writeback", "runs", "--job", name, "--json"]).output)
    assert [(r["run_id"], r["execution_id"], r["succeeded_rows"]) for r in listed] == [
        ("replayed", replay.execution_id, 0), ("replayed", first.execution_id, 30)]
    some_id = first.ledger.record_rows()[0]["external_id"]
    sent = json.loads(CliRunner().invoke(main, ["writeback", "runs", "--job", name, "--external-id", some_id,
                                                "--json"]).output)
    assert [r["execution_id"] for r in sent] == [first.execution_id]  # the replay sent nothing
    table = CliRunner().invoke(main, ["writeback", "runs", "--run-id", "replayed"]).output.splitlines()
    assert table[0].split()[:4] == ["job", "run_id", "execution_id", "status"]
    assert [line.split()[2] for line in table[1:]] == [replay.execution_id, first.execution_id]
