"""A run keeps the collector's full passes off its path: the heap that existed before it is
frozen for the run's duration and handed back after (nexus_pipelines/heap.py)."""

from __future__ import annotations

import gc

from .support import context, job, make_config, seed


def test_the_heap_that_existed_before_a_run_is_frozen_during_it_and_thawed_after(bq_client, make_runner, sim_state):
    runner = make_runner(make_config(seed(bq_client), batch_size=10), sim_state, job_name=job())
    assert gc.get_freeze_count() == 0
    frozen = [gc.get_freeze_count() for _ in runner.execute(context())]
    assert frozen and min(frozen) > 0
    assert gc.get_freeze_count() == 0
    assert len(runner.ledger.record_rows()) == 30


def test_a_run_its_consumer_abandons_thaws_the_heap(bq_client, make_runner, sim_state):
    runner = make_runner(make_config(seed(bq_client), batch_size=10), sim_state, job_name=job())
    events = runner.execute(context())
    next(events)
    assert gc.get_freeze_count() > 0
    events.close()
    assert gc.get_freeze_count() == 0
