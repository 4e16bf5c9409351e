"""The writeback's staging acceptance (docs/design/writeback-run.md), reproduced on the local stack: real
Postgres, the BigQuery emulator, and the NexusCRM simulator (over HTTP on loopback
where several processes must share one CRM)."""

from __future__ import annotations

import multiprocessing
import os
import uuid

import pytest

from nexus_pipelines.integrations.nexuscrm import NexusCrmClient, NexusCrmCredentials
from nexus_pipelines.local.simulators.http import serve_in_thread
from nexus_pipelines.local.simulators.nexuscrm import build_nexuscrm_app
from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper

from .support import context, make_config, new_state, seed_source, SIM_URL

OBJ = MonthEndArrMapper.TARGET_OBJECT
KEY = "001000000000001:2025-04"


@pytest.fixture(scope="module")
def source(bq_client):
    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, 36, negative_every=12)  # rows 11, 23, 35 have a negative ARR
    return dataset


def test_new_unchanged_changed_and_mixed_records_are_created_skipped_and_updated(bq_client, make_runner, source):
    state = new_state()
    config = make_config(source)
    # 1. upsert one new external ID (canary)
    r1 = make_runner(config, state, job_name="acc").run(context("acc-1", external_ids=(KEY,)))
    assert r1.status == "succeeded" and r1.selected == 1 and r1.succeeded == 1
    created = state.get_record(OBJ, "Month_End_ARR_Key__c", KEY)
    assert created is not None and len(state.records(OBJ)) == 1

    # 2. same ID, same payload: skipped, still one CRM row
    r2 = make_runner(config, state, job_name="acc").run(context("acc-2", external_ids=(KEY,)))
    assert r2.unchanged == 1 and r2.succeeded == 0 and state.calls()["upsert"] == 1
    assert len(state.records(OBJ)) == 1

    # 5 (ownership): a field NexusCRM users own is set in the CRM and must survive our writes.
    creds = NexusCrmCredentials(base_url=SIM_URL, client_id=state.client_id, client_secret=state.client_secret)
    from nexus_pipelines.local.simulators.nexuscrm import SimulatorTransport

    with NexusCrmClient(creds, transport=SimulatorTransport(state)) as crm:
        crm.upsert_batch(OBJ, "Month_End_ARR_Key__c", [{"Month_End_ARR_Key__c": KEY, "Owner_Notes__c": "keep me"}])

    # 3. change one owned field: update, not create
    bq_client.query(f"UPDATE `{source}.month_end_arr` SET currency_code = 'GBP' "
                    "WHERE account_id = '001000000000001' AND month_start = DATE '2025-04-01'").result()
    runner = make_runner(config, state, job_name="acc")
    r3 = runner.run(context("acc-3", external_ids=(KEY,)))
    assert r3.succeeded == 1
    updated = state.get_record(OBJ, "Month_End_ARR_Key__c", KEY)
    assert updated["Id"] == created["Id"] and updated["Currency_Code__c"] == "GBP"
    assert updated["Owner_Notes__c"] == "keep me" and len(state.records(OBJ)) == 1
    (row,) = runner.ledger.record_rows([KEY])
    assert row["crm_record_id"] == created["Id"] and row["attempt_count"] == 1

    # 4. one valid and one invalid record in the same allOrNone=false batch
    bad = "001000000000000:2025-12"  # row 11: negative ARR, rejected by the CRM validation rule
    good = "001000000000000:2025-06"
    runner = make_runner(config, state, job_name="acc")
    r4 = runner.run(context("acc-4", external_ids=(good, bad)))
    assert (r4.succeeded, r4.permanently_failed, r4.batches) == (1, 1, 1)
    attempts = dict(runner.ledger.conn.execute(
        "SELECT external_id, status || ':' || coalesce(error_code, '') FROM outbound_record_attempts "
        "WHERE run_id = 'acc-4'").fetchall())
    assert attempts == {good: "succeeded:", bad: "permanent_failed:FIELD_CUSTOM_VALIDATION_EXCEPTION"}


# -- 6 and 7: several processes share one CRM served over HTTP --------------------------


def _child_run(pg_dsn, bq_url, sim_url, client_id, client_secret, source, job_name, run_id, crash_after_upsert,
               barrier, results):
    os.environ.update({"NEXUSCRM_BASE_URL": sim_url, "NEXUSCRM_CLIENT_ID": client_id,
                       "NEXUSCRM_CLIENT_SECRET": client_secret})
    from nexus_pipelines.control.db import connect
    from nexus_pipelines.integrations.bigquery import make_bigquery_client
    from nexus_pipelines.writeback.config import parse_config
    from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper
    from nexus_pipelines.writeback.ledger import Ledger
    from nexus_pipelines.writeback.runner import Runner
    from tests.writeback.support import CONFIG_DIR, config_dict
    from tests.writeback.support import context as make_context

    data = config_dict(source, batch_size=10)
    data["target"]["local_mode"] = True
    loaded = parse_config(data, base_dir=CONFIG_DIR)
    with connect(pg_dsn) as conn:
        runner = Runner(job_name, MonthEndArrMapper(), loaded, bq=make_bigquery_client("nexus-test", "US", bq_url),
                        conn=conn)
        if crash_after_upsert:
            def crash(*args, **kwargs):
                os._exit(137)  # killed after the CRM accepted the batch, before the ledger commit

            Ledger.commit_batch = crash  # this child process's own class: the commit thread's ledger too
        if barrier is not None:
            barrier.wait(timeout=60)
        result = runner.run(make_context(run_id))
    results.put((run_id, result.status, result.succeeded, result.error_message))


@pytest.fixture
def http_crm():
    state = new_state()
    state.latency_s = 0.05
    url, stop = serve_in_thread(build_nexuscrm_app(state))
    yield state, url
    stop()


def _spawn(ctx, args):
    return ctx.Process(target=_child_run, args=args)


@pytest.mark.slow
def test_a_run_killed_after_its_upsert_before_the_commit_replays_without_duplicates(control_dsn, bq_emulator_url, source, http_crm,
                                                                    control_conn):
    state, url = http_crm
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    base = (control_dsn, bq_emulator_url, url, state.client_id, state.client_secret, source, "acc6")
    child = _spawn(ctx, (*base, "crash-1", True, None, results))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 137
    # The CRM has batch 1, and batch 2 when it was sent while batch 1's commit ran.
    upserts = state.calls()["upsert"]
    assert upserts in (1, 2) and len(state.records(OBJ)) == 10 * upserts
    assert control_conn.execute("SELECT count(*) FROM outbound_records WHERE job_name = 'acc6'").fetchone() == (0,)
    assert control_conn.execute("SELECT status FROM outbound_runs WHERE run_id = 'crash-1'").fetchone() == ("running",)

    # The killed execution's lease has not run out, but its control-plane session is gone: the
    # replay with the same --run-id says so, marks it abandoned and sends what it did not record.
    replay = _spawn(ctx, (*base, "crash-1", False, None, results))
    replay.start()
    replay.join(timeout=120)
    run_id, status, succeeded, _ = results.get(timeout=10)
    assert (run_id, status) == ("crash-1", "completed_with_errors") and succeeded == 33
    keys = [r["Month_End_ARR_Key__c"] for r in state.records(OBJ)]
    assert len(keys) == len(set(keys)) == 33  # one CRM record per external ID
    rows = dict(control_conn.execute(
        "SELECT external_id, status FROM outbound_records WHERE job_name = 'acc6'").fetchall())
    assert len(rows) == 36 and sum(1 for s in rows.values() if s == "succeeded") == 33
    crm_ids = {r["Month_End_ARR_Key__c"]: r["Id"] for r in state.records(OBJ)}
    ledger_ids = dict(control_conn.execute(
        "SELECT external_id, crm_record_id FROM outbound_records WHERE job_name = 'acc6' AND status = 'succeeded'"))
    assert ledger_ids == crm_ids
    executions = control_conn.execute("SELECT status, error_message FROM outbound_runs WHERE run_id = 'crash-1' "
                                      "ORDER BY started_at").fetchall()
    assert [s for s, _ in executions] == ["abandoned", "completed_with_errors"]
    assert executions[0][1].startswith("abandoned: its control-plane session ended while it held the lease")


@pytest.mark.slow
def test_of_two_simultaneous_runs_only_one_writes(control_dsn, bq_emulator_url, source, http_crm):
    state, url = http_crm
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    barrier = ctx.Barrier(2)
    base = (control_dsn, bq_emulator_url, url, state.client_id, state.client_secret, source, "acc7")
    procs = [_spawn(ctx, (*base, f"sim-{i}", False, barrier, results)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    outcomes = sorted(results.get(timeout=10)[1] for _ in procs)
    assert outcomes == ["completed_with_errors", "skipped_already_running"]
    keys = [r["Month_End_ARR_Key__c"] for r in state.records(OBJ)]
    assert len(keys) == len(set(keys)) == 33
