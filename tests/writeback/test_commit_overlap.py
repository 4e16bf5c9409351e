"""A batch's commit runs while the next batch is in flight (docs/design/writeback-run.md,
"Batches"), and a run that stops meanwhile still counts what was committed."""

from __future__ import annotations

import threading

from nexus_pipelines.integrations.nexuscrm import NexusCrmUnavailable
from nexus_pipelines.writeback.ledger import Ledger

from .support import context, job, make_config, seed


def _wrap_upserts(runner, on_call):
    """The runner's CRM client calls `on_call(n)` before its n-th upsert."""
    original = runner.crm_factory

    def factory(loaded):
        client = original(loaded)
        upsert, calls = client.upsert_batch, [0]

        def counted(*args, **kwargs):
            calls[0] += 1
            on_call(calls[0])
            return upsert(*args, **kwargs)

        client.upsert_batch = counted
        return client

    runner.crm_factory = factory


def test_a_batch_commit_runs_while_the_next_batch_is_in_flight(bq_client, make_runner, sim_state, monkeypatch):
    runner = make_runner(make_config(seed(bq_client), batch_size=10), sim_state, job_name=job())
    second_sent = threading.Event()
    overlapped: list[bool] = []
    commit = Ledger.commit_batch

    def commit_after_the_next_send(self, run_id, batch_id, *args, **kwargs):
        if batch_id.endswith(":000001"):
            # Sequential commits never get here with batch 2 sent: the wait runs out.
            overlapped.append(second_sent.wait(timeout=10))
        return commit(self, run_id, batch_id, *args, **kwargs)

    monkeypatch.setattr(Ledger, "commit_batch", commit_after_the_next_send)
    _wrap_upserts(runner, lambda n: second_sent.set() if n == 2 else None)
    result = runner.run(context())
    assert overlapped == [True]
    assert result.status == "succeeded" and result.succeeded == 30 and result.batches == 3
    assert len(runner.ledger.record_rows()) == 30


def test_a_run_failing_in_a_crm_call_counts_the_batch_committed_meanwhile(bq_client, make_runner, sim_state):
    runner = make_runner(make_config(seed(bq_client), batch_size=10), sim_state, job_name=job())

    def fail_second(n):
        if n == 2:
            raise NexusCrmUnavailable("NexusCRM unavailable after 5 attempts")

    _wrap_upserts(runner, fail_second)
    result = runner.run(context("inflight-1"))
    assert result.status == "failed" and "NexusCrmUnavailable" in result.error_message
    assert result.batches == 1 and result.succeeded == 10
    row = runner.ledger.run_row("inflight-1")
    assert (row["batches"], row["succeeded_rows"]) == (1, 10)
    assert [r["status"] for r in runner.ledger.record_rows()] == ["succeeded"] * 10
