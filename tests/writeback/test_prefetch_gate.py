"""The write pass's prefetch thread starts a page only while a CRM call is in flight and
no batch commit is (docs/design/writeback-run.md, "Batches"): a page read and mapped holds
the interpreter for tens of milliseconds, and a commit overlapping it waited that long."""

from __future__ import annotations

import threading

from nexus_pipelines.writeback.ledger import Ledger
from nexus_pipelines.writeback.prefetch import Gate, gated

from .support import context, job, make_config, seed


def _start_first_page(gate: Gate) -> threading.Event:
    """A thread that takes the first page through `gate`; the event is set once it has."""
    started = threading.Event()

    def pages():
        started.set()
        yield ["page"]

    threading.Thread(target=lambda: next(gated(pages(), gate)), daemon=True).start()
    return started


def test_a_page_starts_only_once_the_batch_commit_in_flight_returns():
    gate = Gate()
    gate.set(crm=True, committing=True)
    started = _start_first_page(gate)
    assert not started.wait(timeout=0.3)  # a CRM call is in flight, but so is a commit
    gate.set(committing=False)
    assert started.wait(timeout=10)


def test_a_writer_waiting_for_a_page_opens_the_gate_even_while_a_commit_runs():
    gate = Gate()
    gate.set(committing=True, starving=True)
    assert _start_first_page(gate).wait(timeout=10)


def test_each_batch_commit_of_a_run_holds_the_prefetch_gate_shut_until_it_returns(
        bq_client, make_runner, sim_state, monkeypatch):
    runner = make_runner(make_config(seed(bq_client), batch_size=10), sim_state, job_name=job(),
                         write_page_size=10)
    during: list[bool] = []
    commit = Ledger.commit_batch

    def observed(self, *args, **kwargs):
        during.append(runner._gate.flags["committing"])
        return commit(self, *args, **kwargs)

    monkeypatch.setattr(Ledger, "commit_batch", observed)
    result = runner.run(context())
    assert result.status == "succeeded" and result.batches == 3
    assert during == [True, True, True]
    assert runner._gate.flags["committing"] is False
