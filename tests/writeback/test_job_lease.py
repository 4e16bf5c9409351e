"""The single-writer job lease: renewed while a run works, and a second run while it is
held is skipped (real Postgres, emulator, simulator)."""

from __future__ import annotations

import time
import types
from datetime import timedelta

from nexus_pipelines.writeback import runner as runner_module
from nexus_pipelines.writeback.ledger import Ledger

from .support import context, job, make_config, seed


def test_write_pass_renews_the_lease_while_pages_have_nothing_to_send(bq_client, make_runner, sim_state,
                                                                     monkeypatch):
    source, name = seed(bq_client, 30), job()
    config = make_config(source, batch_size=10)
    first = make_runner(config, sim_state, job_name=name)
    assert first.run(context()).succeeded == 30
    # Only the last row (in external-ID order) changed: the write pass reads 29 pages
    # with nothing to send before its only batch.
    first.ledger.conn.execute(
        "UPDATE outbound_records SET payload_hash = 'changed' WHERE job_name = %s AND external_id = "
        "(SELECT max(external_id) FROM outbound_records WHERE job_name = %s)", (name, name))

    clock = [0.0]

    def monotonic() -> float:  # every reading is a quarter TTL and more after the last one
        clock[0] += 1000.0
        return clock[0]

    monkeypatch.setattr(runner_module, "time", types.SimpleNamespace(
        monotonic=monotonic, perf_counter=time.perf_counter, sleep=time.sleep))
    runner = make_runner(config, sim_state, job_name=name, write_page_size=1)
    renewals = []
    renew = runner.ledger.renew_lease
    runner.ledger.renew_lease = lambda lease, ttl: renewals.append(1) or renew(lease, ttl)
    result = runner.run(context())
    assert result.status == "succeeded" and result.succeeded == 1 and result.batches == 1
    assert len(renewals) >= 30  # once per page read in the write pass, not only before a batch


def test_a_second_run_while_the_lease_is_held_is_skipped_naming_the_holder_and_its_lease_end(
        bq_client, make_runner, sim_state):
    name = job()
    runner = make_runner(make_config(seed(bq_client)), sim_state, job_name=name)
    holder = Ledger(runner.ledger.conn, name, runner.mapper.TARGET_OBJECT)
    held = holder.acquire_lease("other-run", timedelta(minutes=5))
    result = runner.run(context("second"))
    assert result.status == "skipped_already_running" and result.exit_code == 0
    assert sim_state.calls() == {}
    assert (result.lease_holder.run_id, result.lease_holder.execution_id) == ("other-run", holder.execution_id)
    assert result.lease_holder.expires_at == held.expires_at
    assert result.error_message == (f"another execution holds the {name} lease: run other-run (execution "
                                    f"{holder.execution_id}) holds it until {held.expires_at:%Y-%m-%d %H:%M:%S} UTC")
    row = runner.ledger.run_row("second")
    assert (row["status"], row["error_message"]) == ("skipped_already_running", result.error_message)
    runner.ledger.release_lease(held)


def pausing_factory(state, on_first_upsert):
    """CRM clients whose first upsert calls `on_first_upsert()` before it is sent."""
    from .support import crm_factory

    def factory(loaded):
        client = crm_factory(state)(loaded)
        upsert = client.upsert_batch
        pending = [on_first_upsert]

        def upsert_batch(*args, **kwargs):
            if pending:
                pending.pop()()
            return upsert(*args, **kwargs)

        client.upsert_batch = upsert_batch
        return client

    return factory


def run_interrupted(make_runner, bq_client, sim_state, during_first_upsert):
    """Run `same` of a fresh job; just before its first upsert, `during_first_upsert(first,
    another_execution)` runs (another_execution() runs `same` again and returns its result)."""
    config, name = make_config(seed(bq_client, 30), batch_size=10), job()
    others = []

    def another_execution():
        other = make_runner(config, sim_state, job_name=name)
        others.append(other)
        return other.run(context("same"))

    first = make_runner(config, sim_state, job_name=name)
    first.crm_factory = pausing_factory(sim_state, lambda: during_first_upsert(first, another_execution))
    result = first.run(context("same"))
    return name, first, result, others[0]


def test_a_second_execution_of_a_live_run_id_is_refused_naming_the_holder(bq_client, make_runner, sim_state):
    outcomes = []
    name, first, result, second = run_interrupted(
        make_runner, bq_client, sim_state, lambda first, again: outcomes.append(again()))
    (refused,) = outcomes
    assert refused.status == "failed" and refused.exit_code == 1
    assert refused.error_message.startswith(f"run same is already executing (the {name} lease: run same (execution "
                                            f"{first.execution_id}) holds it until ")
    assert refused.lease_holder.alive and refused.lease_holder.execution_id == first.execution_id
    assert sim_state.calls()["upsert"] == 3  # only the first execution wrote
    assert result.status == "succeeded" and result.succeeded == 30
    row = first.ledger.run_row("same")
    assert (row["status"], row["execution_id"], row["succeeded_rows"]) == ("succeeded", first.execution_id, 30)
    assert second.table_id is None  # the refused execution made no candidate table


def test_an_execution_whose_lease_ran_out_is_abandoned_by_the_replay_that_took_over(bq_client, make_runner,
                                                                                     sim_state):
    outcomes = []

    def lease_runs_out_and_the_run_id_is_replayed(first, again):
        first.ledger.conn.execute(
            "UPDATE leases SET expires_at = clock_timestamp() - interval '1 second', "
            "acquired_at = clock_timestamp() - interval '1 hour' WHERE lease_name = %s",
            (f"writeback:{first.job_name}",))
        outcomes.append(again())

    _, first, stale, replay = run_interrupted(make_runner, bq_client, sim_state,
                                              lease_runs_out_and_the_run_id_is_replayed)
    (took_over,) = outcomes
    assert took_over.status == "succeeded" and took_over.succeeded == 30
    assert took_over.took_over.startswith(f"took over the {first.job_name} lease and marked run same execution "
                                          f"{first.execution_id} abandoned: its lease ran out at ")
    assert stale.status == "failed" and "lease" in stale.error_message
    # The stale execution, still working, cannot rewrite either row: each keeps its own.
    rows = {r["execution_id"]: r for r in first.ledger.executions("same")}
    assert (rows[replay.execution_id]["status"], rows[replay.execution_id]["succeeded_rows"]) == ("succeeded", 30)
    abandoned = rows[first.execution_id]
    assert abandoned["status"] == "abandoned" and abandoned["ended_at"] is not None
    assert abandoned["error_message"].startswith("abandoned: its lease ran out at ")
    assert f"execution {replay.execution_id} of run same took over" in abandoned["error_message"]
    assert replay.table_id != first.table_id  # each execution its own candidate table
