"""Regression tests for defects found in review (real Postgres, emulator, simulator)."""

from __future__ import annotations

import time
import types
import uuid

from nexus_pipelines.writeback import runner as runner_module
from nexus_pipelines.writeback.jobs.month_end_arr.demo_data import seed_source

from .conftest import context, make_config


def _seed(bq_client, rows: int) -> str:
    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, rows)
    return dataset


def _job() -> str:
    return f"mea_{uuid.uuid4().hex[:8]}"


def test_write_pass_renews_the_lease_while_pages_have_nothing_to_send(bq_client, make_runner, sim_state,
                                                                     monkeypatch):
    source, name = _seed(bq_client, 30), _job()
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


def test_retry_backoff_of_a_long_failing_record_does_not_overflow(bq_client, make_runner, sim_state):
    from nexus_pipelines.local.simulators.nexuscrm import Fault

    source, name = _seed(bq_client, 10), _job()
    config = make_config(source, batch_size=10, max_attempts=1)
    sim_state.faults.push(Fault.status(500))
    first = make_runner(config, sim_state, job_name=name)
    assert first.run(context()).retryable_failed == 10
    # A record that has stayed retryable for its current payload over many runs.
    first.ledger.conn.execute(
        "UPDATE outbound_records SET attempt_count = 5000, next_retry_at = clock_timestamp() - interval '1 minute' "
        "WHERE job_name = %s", (name,))
    sim_state.faults.push(Fault.status(500))
    runner = make_runner(config, sim_state, job_name=name)
    result = runner.run(context())
    assert result.status == "completed_with_errors" and result.retryable_failed == 10
    rows = runner.ledger.record_rows()
    assert {r["attempt_count"] for r in rows} == {5001}
    assert all(r["status"] == "retryable_failed" and r["next_retry_at"] is not None for r in rows)


def test_a_decimal_beyond_the_default_context_precision_is_a_mapping_error():
    from decimal import Decimal

    import pytest

    from nexus_pipelines.writeback.mapping import MappingError, exact_decimal

    # A NUMERIC with 27 integer digits: quantizing it to 2 places needs 29 significant digits.
    with pytest.raises(MappingError, match="exceeds precision 16"):
        exact_decimal(Decimal("9" * 27), "ARR_Amount__c", precision=16, scale=2)
    with pytest.raises(MappingError, match="exceeds precision 16"):
        exact_decimal(Decimal("1E+40"), "ARR_Amount__c", precision=16, scale=2)
    assert exact_decimal(Decimal("12.5"), "ARR_Amount__c", precision=16, scale=2) == Decimal("12.50")


def test_run_job_exit_code_follows_the_contract_for_blocking_failures(tmp_path, control_dsn, bq_emulator_url,
                                                                       bq_client):
    """A forced replay that hits the CRM unique conflict again reports it as blocking:
    the in-process `run-job` exit code agrees with JobResult.exit_code (section 11)."""
    from nexus_pipelines.local.simulators.nexuscrm import FieldSpec, NexusCrmState
    from nexus_pipelines.writeback.execute import run_in_process
    from nexus_pipelines.writeback.jobs.month_end_arr import crm_metadata

    from .test_dagster import SimCrm, write_config

    from nexus_pipelines.control.resources import ControlPlaneResource
    from nexus_pipelines.integrations.resources import BigQueryClientResource

    state = NexusCrmState()
    state.define_object("Month_End_ARR__c", [
        FieldSpec(s.name, type=s.type, unique=True, length=s.length) if s.name == "Account_External_Id__c" else s
        for s in crm_metadata.field_specs()])
    source = _seed(bq_client, 24)
    config_path = write_config(tmp_path, source)
    resources = {
        "control_plane": ControlPlaneResource(dsn=control_dsn),
        "bigquery": BigQueryClientResource(project="nexus-test", location="US", emulator_url=bq_emulator_url),
        "nexuscrm_writeback": SimCrm(state),
    }
    first = run_in_process("month_end_arr", config_path, resources=resources, run_id="blk-1")
    assert first.status == "completed_with_errors" and first.exit_code == 2
    forced = run_in_process("month_end_arr", config_path, resources=resources, run_id="blk-2", force=True)
    assert forced.status == "completed_with_errors" and forced.counts["new_permanent_failures"] == 0
    assert forced.counts["blocking_failures"] == 22
    assert forced.exit_code == 2


def test_dagster_assets_close_the_bigquery_clients_they_create(tmp_path, control_dsn, bq_emulator_url, bq_client):
    from dagster import materialize

    from nexus_pipelines.control.resources import ControlPlaneResource
    from nexus_pipelines.integrations.resources import BigQueryClientResource
    from nexus_pipelines.writeback.definitions import writeback_ledger_export

    from .test_dagster import DEFINITION, SimCrm, write_config
    from nexus_pipelines.writeback.assets import build_writeback_assets, source_asset_spec

    opened, closed = [], []

    class TrackedBigQuery(BigQueryClientResource):
        def get_client(self):
            client = super().get_client()
            opened.append(client)
            close = client.close
            client.close = lambda: (closed.append(client), close())[1]
            return client

    resource = TrackedBigQuery(project="nexus-test", location="US", emulator_url=bq_emulator_url)
    from .conftest import new_state

    result = materialize(
        [source_asset_spec(DEFINITION), build_writeback_assets(DEFINITION)],
        resources={"control_plane": ControlPlaneResource(dsn=control_dsn), "bigquery": resource,
                   "nexuscrm_writeback": SimCrm(new_state())},
        run_config={"ops": {"writeback_month_end_arr": {"config": {
            "config_path": write_config(tmp_path, _seed(bq_client, 12)), "run_id": "bq-close-1"}}}})
    assert result.success
    exported = materialize([writeback_ledger_export],
                           resources={"control_plane": ControlPlaneResource(dsn=control_dsn), "bigquery": resource},
                           run_config={"ops": {"nexuscrm_control__ledger_export": {
                               "config": {"dataset": f"ctl_{uuid.uuid4().hex[:6]}"}}}})
    assert exported.success
    assert len(opened) == 2 and [id(c) for c in closed] == [id(c) for c in opened]


def test_a_project_id_with_a_dot_is_a_config_error():
    import pytest

    from nexus_pipelines.writeback.config import ConfigError, parse_config

    from .conftest import CONFIG_DIR, config_dict

    for section in ("source", "state"):
        data = config_dict("finance_marts")
        data[section]["project"] = "my.project"
        with pytest.raises(ConfigError, match=rf"{section}\.project: .*not a project id"):
            parse_config(data, base_dir=CONFIG_DIR)
