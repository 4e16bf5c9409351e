"""Writeback fixtures: the NexusCRM simulator (in-process transport), job configs that
point at this module's datasets, and a runner factory over real Postgres + emulator."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from nexus_pipelines.control.db import connect
from nexus_pipelines.integrations.nexuscrm import NexusCrmClient, NexusCrmCredentials
from nexus_pipelines.local.simulators.nexuscrm import NexusCrmState, SimulatorTransport
from nexus_pipelines.settings import PROJECT_ROOT
from nexus_pipelines.writeback.config import parse_config
from nexus_pipelines.writeback.contract import JobContext
from nexus_pipelines.writeback.jobs.month_end_arr import crm_metadata
from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper
from nexus_pipelines.writeback.runner import Runner

CONFIG_DIR = PROJECT_ROOT / "configs" / "jobs"
SIM_URL = "https://nexuscrm.sim.test"


def config_dict(source_dataset: str, control_dataset: str = "wb_control", **write) -> dict:
    return {
        "version": 1,
        "source": {
            "project": "nexus-test", "location": "US",
            "sql_file": "../../sql/jobs/month_end_arr.sql",
            "readiness_sql_file": "../../sql/jobs/month_end_arr-readiness.sql",
            "freshness_max_age_minutes": 180,
            "sql_vars": {"source_dataset": source_dataset},
        },
        "target": {"base_url_env": "NEXUSCRM_BASE_URL", "api_version": "v63.0",
                   "client_id_env": "NEXUSCRM_CLIENT_ID", "client_secret_env": "NEXUSCRM_CLIENT_SECRET"},
        "state": {"project": "nexus-test", "dataset": control_dataset},
        "write": {"batch_size": 200, "all_or_none": False, "skip_unchanged": True, "delete_policy": "ignore",
                  "max_attempts": 3, "base_backoff_seconds": 1, "max_backoff_seconds": 30, **write},
        "schedule": {"cron": "0 3 * * *", "timezone": "UTC", "paused": True},
    }


def make_config(source_dataset: str, control_dataset: str = "wb_control", **write):
    return parse_config(config_dict(source_dataset, control_dataset, **write), base_dir=CONFIG_DIR)


def new_state() -> NexusCrmState:
    state = NexusCrmState()
    crm_metadata.define_object(state)
    state.add_validation_rule(MonthEndArrMapper.TARGET_OBJECT, crm_metadata.reject_negative_arr)
    return state


def crm_factory(state: NexusCrmState, sleeps: list | None = None):
    def factory(loaded):
        w = loaded.config.write
        creds = NexusCrmCredentials(base_url=SIM_URL, client_id=state.client_id, client_secret=state.client_secret)
        return NexusCrmClient(creds, transport=SimulatorTransport(state), max_attempts=w.max_attempts,
                              base_backoff_s=w.base_backoff_seconds, max_backoff_s=w.max_backoff_seconds,
                              sleep=(sleeps.append if sleeps is not None else (lambda s: None)))

    return factory


def context(run_id: str | None = None, **kwargs) -> JobContext:
    return JobContext(run_id=run_id or f"run-{uuid.uuid4().hex[:10]}", started_at=datetime.now(UTC),
                      dry_run=kwargs.pop("dry_run", False), **kwargs)


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
