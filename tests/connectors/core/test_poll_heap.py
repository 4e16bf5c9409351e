"""A poll run keeps the collector's full passes off its page loop: the heap that existed before
it is frozen while it runs and handed back after (nexus_pipelines/heap.py)."""

import gc

from nexus_pipelines.connectors.core.tick import poll
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.local.worlds.plant import executor
from tests.connectors.support import due_gitlab_poll


def test_the_heap_that_existed_before_a_poll_run_is_frozen_while_it_runs_and_thawed_after(pool):
    plant, registration = due_gitlab_poll(pool, "heap", issues=30, page_size=10)
    frozen: list[int] = []
    assert gc.get_freeze_count() == 0
    with pool.connection() as conn:
        report = poll(conn, REGISTRY, plant.composer, owner="poller", executor=executor(),
                      registration_ids=[registration.registration_id],
                      on_tick=lambda _: frozen.append(gc.get_freeze_count()))
    assert report.totals["admitted"] == 30 and len(frozen) == len(report.ticks) >= 3
    assert min(frozen) > 0
    assert gc.get_freeze_count() == 0
