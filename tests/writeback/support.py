"""Helpers shared by the writeback tests: job configs pointing at a test's own datasets,
the NexusCRM simulator behind the real client, source seeding and Dagster resources."""

from __future__ import annotations

import itertools
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from nexus_pipelines.integrations.nexuscrm import NexusCrmClient, NexusCrmCredentials
from nexus_pipelines.local.simulators.nexuscrm import FieldSpec, NexusCrmState, SimulatorTransport, rejects_negative
from nexus_pipelines.settings import PROJECT_ROOT
from nexus_pipelines.writeback.config import parse_config
from nexus_pipelines.writeback.contract import JobContext
from nexus_pipelines.local import month_end_arr_source
from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper

CONFIG_DIR = PROJECT_ROOT / "configs" / "jobs"
SIM_URL = "https://nexuscrm.sim.test"
OBJ = MonthEndArrMapper.TARGET_OBJECT


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


def write_config(tmp_path: Path, source_dataset: str, **target) -> str:
    """A job config file outside the repository (SQL paths made relative to it)."""
    data = config_dict(source_dataset, f"ctl_{uuid.uuid4().hex[:6]}")
    data["target"].update(target)
    rel = os.path.relpath(CONFIG_DIR, tmp_path)
    data["source"]["sql_file"] = f"{rel}/{data['source']['sql_file']}"
    data["source"]["readiness_sql_file"] = f"{rel}/{data['source']['readiness_sql_file']}"
    path = tmp_path / f"month_end_arr_{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


# A field NexusCRM's own users own: the writeback never writes it.
OWNER_NOTES = FieldSpec("Owner_Notes__c", length=255)


def deploy(state: NexusCrmState, **changed: FieldSpec) -> NexusCrmState:
    """Month_End_ARR__c deployed in `state` from the mapper's field contract, with some
    fields deployed differently (`Name__c=FieldSpec(...)`) to show drift or conflicts."""
    specs = [changed.get(c.name, FieldSpec.from_contract(c)) for c in MonthEndArrMapper.FIELDS]
    state.define_object(OBJ, [*specs, OWNER_NOTES], key_prefix="a0M")
    return state


def new_state() -> NexusCrmState:
    """The CRM of most tests: the object as declared, and a validation rule rejecting negative ARR."""
    state = deploy(NexusCrmState())
    state.add_validation_rule(OBJ, rejects_negative("ARR_Amount__c"))
    return state


def crm_factory(state: NexusCrmState, sleeps: list | None = None):
    def factory(loaded):
        w = loaded.config.write
        creds = NexusCrmCredentials(base_url=SIM_URL, client_id=state.client_id, client_secret=state.client_secret)
        return NexusCrmClient(creds, transport=SimulatorTransport(state), max_attempts=w.max_attempts,
                              base_backoff_s=w.base_backoff_seconds, max_backoff_s=w.max_backoff_seconds,
                              sleep=(sleeps.append if sleeps is not None else (lambda s: None)))

    return factory


class SimCrm:
    """Stands in for the NexusCrmWritebackResource: clients on the in-process simulator."""

    def __init__(self, state: NexusCrmState) -> None:
        self.state = state

    def factory(self):
        return crm_factory(self.state)


def context(run_id: str | None = None, **kwargs) -> JobContext:
    return JobContext(run_id=run_id or f"run-{uuid.uuid4().hex[:10]}", started_at=datetime.now(UTC),
                      dry_run=kwargs.pop("dry_run", False), **kwargs)


# Every seeded source has a load time of its own (whole seconds, as the payload carries it):
# two tests seeding the same rows in one second wrote equal payloads under the same job's
# ledger, so the later one found rows "unchanged" that it had never sent.
_SESSION_LOAD = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
_loads = itertools.count(1)


def seed_source(bq_client, dataset: str, rows: int, **options) -> None:
    """month_end_arr_source.seed_source with a load time no other seed of this test session has."""
    options.setdefault("finished_at", _SESSION_LOAD - timedelta(seconds=next(_loads)))
    month_end_arr_source.seed_source(bq_client, dataset, rows, **options)


def seed(bq_client, rows: int = 30, negative_every: int = 0) -> str:
    """A fresh source dataset with `rows` Month End ARR rows."""
    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, rows, negative_every=negative_every)
    return dataset


def job() -> str:
    """A job name of the test's own, so ledgers and leases of tests never meet."""
    return f"mea_{uuid.uuid4().hex[:8]}"


def dagster_resources(control_dsn: str, bq_emulator_url: str, state: NexusCrmState) -> dict:
    from nexus_pipelines.control.resources import ControlPlaneResource
    from nexus_pipelines.integrations.resources import WarehouseResource

    return {
        "control_plane": ControlPlaneResource(dsn=control_dsn),
        "bigquery": WarehouseResource(project="nexus-test", location="US", emulator_url=bq_emulator_url),
        "nexuscrm_writeback": SimCrm(state),
    }
