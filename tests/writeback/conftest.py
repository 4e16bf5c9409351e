"""Writeback fixtures: the NexusCRM simulator and a runner factory over real Postgres and
the BigQuery emulator (helpers live in support.py)."""

from __future__ import annotations

import pytest

from nexus_pipelines.control.db import connect
from nexus_pipelines.local.simulators.nexuscrm import NexusCrmState
from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper
from nexus_pipelines.writeback.runner import Runner

from .support import crm_factory, new_state


@pytest.fixture
def sim_state() -> NexusCrmState:
    return new_state()


@pytest.fixture
def make_runner(control_dsn, bq_client):
    conns = []

    def build(config, state, *, job_name="month_end_arr", sleeps=None, **kwargs) -> Runner:
        conn = connect(control_dsn)
        conns.append(conn)
        return Runner(job_name, MonthEndArrMapper(), config, bq=bq_client, conn=conn,
                      crm_factory=crm_factory(state, sleeps), **kwargs)

    yield build
    for conn in conns:
        conn.close()
