"""The single-writer job lease: renewed while a run works, and a second run while it is
held is skipped (real Postgres, emulator, simulator)."""

from __future__ import annotations

import time
import types
from datetime import timedelta

from nexus_pipelines.writeback import runner as runner_module

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


def test_a_second_run_while_the_lease_is_held_is_skipped(bq_client, make_runner, sim_state):
    runner = make_runner(make_config(seed(bq_client)), sim_state, job_name=job())
    held = runner.ledger.acquire_lease("other-run", timedelta(minutes=5))
    result = runner.run(context("second"))
    assert result.status == "skipped_already_running" and result.exit_code == 0
    assert sim_state.calls() == {}
    assert runner.ledger.run_row("second")["status"] == "skipped_already_running"
    runner.ledger.release_lease(held)
