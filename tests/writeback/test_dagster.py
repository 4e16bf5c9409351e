"""The writeback through Dagster: the asset graph materializes, a failing blocking check
stops the write, a canary touches only the named external IDs, lineage and schedule."""

from __future__ import annotations

import uuid
from contextlib import contextmanager

import pytest
from dagster import AssetKey, DagsterInstance, DefaultScheduleStatus, materialize

from nexus_pipelines.control.resources import ControlPlaneResource
from nexus_pipelines.integrations.resources import WarehouseResource
from nexus_pipelines.writeback.assets import asset_keys, build_writeback_assets, source_asset_spec
from nexus_pipelines.definitions import defs as writeback_defs
from nexus_pipelines.local.month_end_arr_source import mark_load
from nexus_pipelines.writeback.registry import get_job

from .support import dagster_resources, new_state, seed, seed_source, write_config

DEFINITION = get_job("month_end_arr")
KEYS = asset_keys(DEFINITION)


def run(tmp_path, control_dsn, bq_emulator_url, state, source_dataset, **options):
    assets = [source_asset_spec(DEFINITION), build_writeback_assets(DEFINITION)]
    instance = options.pop("instance", None) or DagsterInstance.ephemeral()
    config = {"config_path": write_config(tmp_path, source_dataset), **options}
    return materialize(assets, resources=dagster_resources(control_dsn, bq_emulator_url, state),
                       raise_on_error=False, instance=instance,
                       run_config={"ops": {"writeback_month_end_arr": {"config": config}}})


@pytest.fixture(scope="module")
def source(bq_client):
    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, 60)
    return dataset


def test_asset_graph_materializes_with_checks_and_metadata(tmp_path, control_dsn, bq_emulator_url, source, control_conn):
    state = new_state()
    instance = DagsterInstance.ephemeral()
    result = run(tmp_path, control_dsn, bq_emulator_url, state, source, instance=instance)
    assert result.success
    materialized = {e.asset_key for e in result.get_asset_materialization_events()}
    assert materialized == {KEYS["readiness"], KEYS["candidates"], KEYS["validated"], KEYS["crm"]}
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {"source_ready": True, "source_fresh": True, "external_id_not_null": True,
                      "external_id_unique": True, "mapping_and_ownership": True}
    crm_meta = [e.event_specific_data.materialization for e in result.get_asset_materialization_events()
                if e.asset_key == KEYS["crm"]][0].metadata
    assert crm_meta["succeeded"].value == 60 and crm_meta["selected"].value == 60 and crm_meta["batches"].value == 1
    assert crm_meta["status"].value == "succeeded"
    run_row = control_conn.execute("SELECT status, run_id FROM outbound_runs WHERE run_id = %s", (result.run_id,)).fetchone()
    assert run_row == ("succeeded", result.run_id)  # the Dagster run id is the ledger run id
    logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any("batch 1/1: 60 ok, 0 rejected" in m for m in logs)
    assert len(state.records("Month_End_ARR__c")) == 60


def test_failing_blocking_check_stops_the_write(tmp_path, control_dsn, bq_emulator_url, bq_client, control_conn):
    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, 20)
    mark_load(bq_client, dataset, load_run_id="load-x", status="running")  # not ready
    state = new_state()
    result = run(tmp_path, control_dsn, bq_emulator_url, state, dataset)
    assert not result.success
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks["source_ready"] is False
    materialized = {e.asset_key for e in result.get_asset_materialization_events()}
    assert KEYS["crm"] not in materialized and KEYS["candidates"] not in materialized
    assert state.calls().get("upsert", 0) == 0 and state.calls().get("token", 0) == 0
    assert control_conn.execute("SELECT status FROM outbound_runs WHERE run_id = %s", (result.run_id,)).fetchone() == ("failed",)
    assert control_conn.execute("SELECT count(*) FROM leases").fetchone() == (0,)


def test_new_record_errors_fail_the_dagster_run_and_unchanged_ones_do_not(tmp_path, control_dsn, bq_emulator_url,
                                                                         bq_client):
    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, 40, negative_every=10)
    state = new_state()  # its CRM rejects negative ARR per record
    first = run(tmp_path, control_dsn, bq_emulator_url, state, dataset)
    assert not first.success  # new permanent failures are a non-zero exit
    crm = [e.event_specific_data.materialization for e in first.get_asset_materialization_events()
           if e.asset_key == KEYS["crm"]]
    assert crm and crm[0].metadata["status"].value == "completed_with_errors"
    assert crm[0].metadata["new_permanent_failures"].value == 4 and crm[0].metadata["succeeded"].value == 36
    again = run(tmp_path, control_dsn, bq_emulator_url, state, dataset)
    assert again.success  # unchanged permanent failures are skipped and not re-alerted


def test_canary_run_touches_only_named_external_ids(tmp_path, control_dsn, bq_emulator_url, source, control_conn):
    state = new_state()
    wanted = ["001000000000000:2025-03", "001000000000002:2025-07"]
    result = run(tmp_path, control_dsn, bq_emulator_url, state, source, external_ids=wanted, force=True)
    assert result.success
    written = sorted(r["Month_End_ARR_Key__c"] for r in state.records("Month_End_ARR__c"))
    assert written == sorted(wanted)
    assert [e.record_count for e in state.request_log() if e.path.startswith("/services/data") and "composite" in e.path] == [2]
    attempts = control_conn.execute("SELECT DISTINCT external_id FROM outbound_record_attempts WHERE run_id = %s",
                                    (result.run_id,)).fetchall()
    assert sorted(a[0] for a in attempts) == sorted(wanted)


def test_dry_run_from_launchpad_writes_nothing(tmp_path, control_dsn, bq_emulator_url, source, control_conn):
    state = new_state()
    result = run(tmp_path, control_dsn, bq_emulator_url, state, source, dry_run=True)
    assert result.success
    assert state.calls().get("upsert", 0) == 0
    assert KEYS["crm"] not in {e.asset_key for e in result.get_asset_materialization_events()}
    (observed,) = [e for e in result.get_asset_observation_events() if e.asset_key == KEYS["crm"]]
    meta = observed.event_specific_data.asset_observation.metadata
    assert meta["status"].value == "dry_run" and meta["would_write"].value + meta["unchanged"].value == 60
    row = control_conn.execute("SELECT status, selected_rows FROM outbound_runs WHERE run_id = %s", (result.run_id,)).fetchone()
    assert row == ("dry_run", 60)


def test_definitions_lineage_and_paused_schedule():
    repo = writeback_defs.get_repository_def()
    graph = repo.asset_graph
    assert KEYS["source"] in graph.get(KEYS["readiness"]).parent_keys
    assert KEYS["readiness"] in graph.get(KEYS["candidates"]).parent_keys
    assert KEYS["candidates"] in graph.get(KEYS["validated"]).parent_keys
    assert KEYS["validated"] in graph.get(KEYS["crm"]).parent_keys
    schedule = writeback_defs.get_schedule_def("writeback_month_end_arr_schedule")
    assert schedule.cron_schedule == "0 3 * * *" and schedule.execution_timezone == "UTC"
    assert schedule.default_status == DefaultScheduleStatus.STOPPED
    job = writeback_defs.get_job_def("writeback_month_end_arr_job")
    assert job.tags["nexus/writeback-job"] == "month_end_arr"
    assert AssetKey(["nexuscrm_control", "ledger_export"]) in graph.get_all_asset_keys()


def test_ledger_export_and_retention_assets(control_dsn, bq_emulator_url, control_conn):
    from nexus_pipelines.writeback.definitions import writeback_attempt_retention, writeback_ledger_export

    dataset = f"ctl_{uuid.uuid4().hex[:6]}"
    result = materialize(
        [writeback_ledger_export, writeback_attempt_retention],
        resources={"control_plane": ControlPlaneResource(dsn=control_dsn),
                   "bigquery": WarehouseResource(project="nexus-test", location="US",
                                                      emulator_url=bq_emulator_url)},
        run_config={"ops": {"nexuscrm_control__ledger_export": {"config": {"dataset": dataset}}}},
    )
    assert result.success
    meta = {e.asset_key: e.event_specific_data.materialization.metadata
            for e in result.get_asset_materialization_events()}
    exported = meta[AssetKey(["nexuscrm_control", "ledger_export"])]["outbound_records_rows"].value
    assert exported == control_conn.execute("SELECT count(*) FROM outbound_records").fetchone()[0]


def test_dagster_assets_close_the_bigquery_clients_they_create(tmp_path, control_dsn, bq_emulator_url, bq_client):
    from nexus_pipelines.writeback.definitions import writeback_ledger_export

    opened, closed = [], []

    class TrackedBigQuery(WarehouseResource):
        @contextmanager
        def get_client(self):
            with super().get_client() as client:
                opened.append(client)
                close = client.close
                client.close = lambda: (closed.append(client), close())[1]
                yield client

    resources = {**dagster_resources(control_dsn, bq_emulator_url, new_state()),
                 "bigquery": TrackedBigQuery(project="nexus-test", location="US", emulator_url=bq_emulator_url)}
    result = materialize(
        [source_asset_spec(DEFINITION), build_writeback_assets(DEFINITION)], resources=resources,
        run_config={"ops": {"writeback_month_end_arr": {"config": {
            "config_path": write_config(tmp_path, seed(bq_client, 12)), "run_id": "bq-close-1"}}}})
    assert result.success
    exported = materialize([writeback_ledger_export],
                           resources={"control_plane": resources["control_plane"], "bigquery": resources["bigquery"]},
                           run_config={"ops": {"nexuscrm_control__ledger_export": {
                               "config": {"dataset": f"ctl_{uuid.uuid4().hex[:6]}"}}}})
    assert exported.success
    assert len(opened) == 2 and [id(c) for c in closed] == [id(c) for c in opened]


def test_a_run_skipped_because_another_holds_the_lease_succeeds_with_its_checks_skipped(
        tmp_path, control_dsn, bq_emulator_url, source, control_conn):
    from datetime import timedelta

    from nexus_pipelines.writeback.ledger import Ledger

    state = new_state()
    instance = DagsterInstance.ephemeral()
    holder = Ledger(control_conn, "month_end_arr", "Month_End_ARR__c")
    held = holder.acquire_lease("other-run", timedelta(minutes=5))
    try:
        result = run(tmp_path, control_dsn, bq_emulator_url, state, source, instance=instance)
    finally:
        Ledger(control_conn, "month_end_arr", "Month_End_ARR__c").release_lease(held)
    assert result.success
    assert result.get_asset_check_evaluations() == []  # not evaluated: planned, then skipped
    planned = [e for e in instance.all_logs(result.run_id)
               if e.dagster_event and e.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION_PLANNED"]
    assert len(planned) == 5
    from dagster import AssetCheckKey
    from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

    (record,) = instance.event_log_storage.get_asset_check_execution_history(
        AssetCheckKey(KEYS["readiness"], "source_ready"), limit=1)
    # planned in a run that succeeded: the UI resolves it to SKIPPED
    assert record.status == AssetCheckExecutionRecordStatus.PLANNED and record.run_id == result.run_id
    logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
    until = f"{held.expires_at:%Y-%m-%d %H:%M:%S} UTC"
    assert f"skipped_already_running: another execution holds the month_end_arr lease: run other-run (execution " \
           f"{holder.execution_id}) holds it until {until}" in logs
    (observed,) = [e.dagster_event.event_specific_data.asset_observation.metadata
                   for e in instance.all_logs(result.run_id)
                   if e.dagster_event and e.dagster_event.event_type_value == "ASSET_OBSERVATION"]
    assert observed["lease_holder_run_id"].value == "other-run"
    assert observed["lease_holder_execution_id"].value == holder.execution_id
    assert observed["lease_expires_at"].value == held.expires_at.timestamp()
    assert state.calls() == {}


def test_a_run_that_takes_the_lease_from_a_dead_execution_says_so_in_its_log_and_metadata(
        tmp_path, control_dsn, bq_emulator_url, source):
    from datetime import timedelta

    from nexus_pipelines.control.db import connect
    from nexus_pipelines.writeback.ledger import Ledger

    with connect(control_dsn) as dead:  # an execution whose session ends while it holds the lease
        holder = Ledger(dead, "month_end_arr", "Month_End_ARR__c")
        lease = holder.acquire_lease("died", timedelta(minutes=30))
        holder.start_run("died", dry_run=False, options={}, lease_token=lease.token)
    instance = DagsterInstance.ephemeral()
    result = run(tmp_path, control_dsn, bq_emulator_url, new_state(), source, instance=instance)
    assert result.success
    said = (f"took over the month_end_arr lease and marked run died execution {holder.execution_id} abandoned: its "
            "control-plane session ended while it held the lease (until ")
    assert any(entry.user_message.startswith(said) for entry in instance.all_logs(result.run_id))
    (crm,) = [e.event_specific_data.materialization.metadata for e in result.get_asset_materialization_events()
              if e.asset_key == KEYS["crm"]]
    assert crm["took_over"].value.startswith(said)


def test_a_run_failing_by_policy_shows_one_line_with_its_counts_and_first_rejected_ids(
        tmp_path, control_dsn, bq_emulator_url, bq_client):
    state = new_state()
    result = run(tmp_path, control_dsn, bq_emulator_url, state, seed(bq_client, 40, negative_every=10))
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    description = failure.step_failure_data.user_failure_data.description
    assert "\n" not in description
    assert description.startswith("month_end_arr completed_with_errors (exit code 2): 36 succeeded, 4 permanent "
                                  "(4 new, 0 blocking), 0 retryable, 0 waiting for retry; first rejected: "
                                  "001000000000000:2025-10 FIELD_CUSTOM_VALIDATION_EXCEPTION, ")
    assert "nexus-pipelines writeback records --job month_end_arr --status permanent_failed" in description
    meta = failure.step_failure_data.user_failure_data.metadata
    assert meta["exit_code"].value == 2 and meta["new_permanent_failures"].value == 4


def test_a_partial_selection_of_the_writeback_is_refused_in_one_line(tmp_path, control_dsn, bq_emulator_url, source):
    state = new_state()
    result = materialize([source_asset_spec(DEFINITION), build_writeback_assets(DEFINITION)],
                         resources=dagster_resources(control_dsn, bq_emulator_url, state),
                         selection=[KEYS["candidates"]], raise_on_error=False, instance=DagsterInstance.ephemeral(),
                         run_config={"ops": {"writeback_month_end_arr": {"config": {
                             "config_path": write_config(tmp_path, source)}}}})
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert "runs as a whole" in failure.step_failure_data.user_failure_data.description
    assert state.calls() == {}
