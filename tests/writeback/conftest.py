"""Writeback fixtures: the NexusCRM simulator and a runner factory over real Postgres and
the BigQuery emulator (helpers live in support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexus_pipelines.control.db import connect
from nexus_pipelines.local.bigquery_emulator import InProcessEmulator
from nexus_pipelines.local.simulators.nexuscrm import NexusCrmState
from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper
from nexus_pipelines.writeback.runner import Runner
from nexus_pipelines.writeback.source import emulator_read_client

from .support import crm_factory, new_state


@pytest.fixture(scope="session")
def bq_emulator(tmp_path_factory):
    emulator = InProcessEmulator(Path(tmp_path_factory.mktemp("bq_writeback")))
    emulator.start()
    yield emulator
    emulator.stop()


@pytest.fixture(scope="session")
def bq_emulator_url(bq_emulator) -> str:
    """The suite's emulator URL, from an emulator whose Storage Read (gRPC) endpoint these tests also use."""
    return bq_emulator._server.rest_url


@pytest.fixture(scope="session")
def bq_storage(bq_emulator):
    """A BigQuery Storage Read API client on the emulator (the runner's fast read path)."""
    client = emulator_read_client(bq_emulator._server.grpc_endpoint)
    yield client
    client.transport.close()


@pytest.fixture(scope="session")
def refusing_storage():
    """A Storage Read endpoint that refuses every call as BigQuery does a principal without
    `bigquery.readsessions.*` (PERMISSION_DENIED)."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    def refuse(request, context):
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "request failed: the user does not have "
                      "'bigquery.readsessions.create' permission for 'projects/nexus-test'")

    class Refuse(grpc.GenericRpcHandler):
        def service(self, handler_call_details):
            return grpc.unary_unary_rpc_method_handler(refuse)

    server = grpc.server(ThreadPoolExecutor(max_workers=2), handlers=[Refuse()])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = emulator_read_client(f"127.0.0.1:{port}")
    yield client
    client.transport.close()
    server.stop(0)


@pytest.fixture
def sim_state() -> NexusCrmState:
    return new_state()


@pytest.fixture
def make_runner(control_dsn, bq_client, bq_storage):
    """Runners that read the candidates with the Storage Read API (`storage=None`: with queries)."""
    conns = []

    def build(config, state, *, job_name="month_end_arr", sleeps=None, **kwargs) -> Runner:
        conn = connect(control_dsn)
        conns.append(conn)
        kwargs.setdefault("storage", bq_storage)
        return Runner(job_name, MonthEndArrMapper(), config, bq=bq_client, conn=conn,
                      crm_factory=crm_factory(state, sleeps), **kwargs)

    yield build
    for conn in conns:
        conn.close()
