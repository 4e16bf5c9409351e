"""The retry and failure policy (docs/design/writeback-run.md), row by row, through the runner
(real Postgres, emulator, simulator)."""

from __future__ import annotations

import pytest

from nexus_pipelines.control.db import connect
from nexus_pipelines.local.simulators.nexuscrm import Fault, FieldSpec, NexusCrmState

from .support import OBJ, context, deploy, job, make_config, seed


def records_by_status(runner):
    out: dict[str, list] = {}
    for r in runner.ledger.record_rows():
        out.setdefault(r["status"], []).append(r)
    return out


def test_401_refreshes_the_token_once_then_retries_the_batch_once(bq_client, make_runner, sim_state):
    sim_state.faults.push(Fault.expire_token())
    result = make_runner(make_config(seed(bq_client), batch_size=10), sim_state, job_name=job()).run(context())
    assert result.status == "succeeded" and result.succeeded == 30
    assert sim_state.calls()["token"] == 2
    assert sim_state.calls()["upsert"] == 4 and result.crm_calls == 4


def test_429_and_5xx_back_off_with_jitter_and_honour_retry_after(bq_client, make_runner, sim_state):
    sim_state.faults.push(Fault.status(429, retry_after=3), Fault.status(503))
    sleeps: list[float] = []
    result = make_runner(make_config(seed(bq_client), batch_size=10, max_attempts=5, base_backoff_seconds=2),
                         sim_state, job_name=job(), sleeps=sleeps).run(context())
    assert result.status == "succeeded" and result.crm_calls == 5
    assert sleeps[0] == 3.0  # Retry-After
    assert 0.0 <= sleeps[1] <= 4.0  # full jitter over [0, base * 2^(attempt-1)]
    assert len(sim_state.records(OBJ)) == 30


def test_transient_failures_past_max_attempts_stay_retryable_with_next_retry_at(bq_client, make_runner, sim_state, control_dsn):
    source = seed(bq_client)
    name = job()
    config = make_config(source, batch_size=10, max_attempts=3, base_backoff_seconds=20, max_backoff_seconds=60)
    sim_state.faults.push(Fault.status(500), Fault.status(500), Fault.status(500))
    first_runner = make_runner(config, sim_state, job_name=name)
    first = first_runner.run(context())
    assert first.status == "completed_with_errors" and first.exit_code == 2
    assert (first.succeeded, first.retryable_failed, first.permanently_failed) == (20, 10, 0)
    retryable = records_by_status(first_runner)["retryable_failed"]
    assert all(r["next_retry_at"] is not None and r["error_code"] == "HTTP_500" for r in retryable)
    assert all(r["attempt_count"] == 1 for r in retryable)

    # Not yet due: deferred, nothing sent, still non-zero.
    calls = sim_state.calls()["upsert"]
    second = make_runner(config, sim_state, job_name=name).run(context())
    assert second.deferred == 10 and second.exit_code == 2 and sim_state.calls()["upsert"] == calls

    # Operator replay of retryable rows only.
    third_runner = make_runner(config, sim_state, job_name=name)
    third = third_runner.run(context(retry_failed=True))
    assert third.status == "succeeded" and third.succeeded == 10 and third.unchanged == 20
    assert sim_state.calls()["upsert"] == calls + 1
    rows = {r["external_id"]: r for r in third_runner.ledger.record_rows()}
    assert sorted(r["attempt_count"] for r in rows.values()) == [1] * 20 + [2] * 10
    assert len(sim_state.records(OBJ)) == 30


def test_retry_backoff_of_a_long_failing_record_does_not_overflow(bq_client, make_runner, sim_state):
    source, name = seed(bq_client, 10), job()
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


def test_validation_errors_are_permanent_per_record_and_not_realerted(bq_client, make_runner, sim_state):
    config = make_config(seed(bq_client, rows=40, negative_every=10), batch_size=200)
    name = job()
    first_runner = make_runner(config, sim_state, job_name=name)
    first = first_runner.run(context())
    assert (first.succeeded, first.permanently_failed, first.new_permanent_failures) == (36, 4, 4)
    assert first.exit_code == 2 and first.batches == 1
    failed = records_by_status(first_runner)["permanent_failed"]
    assert {r["error_code"] for r in failed} == {"FIELD_CUSTOM_VALIDATION_EXCEPTION"}
    # the CRM's words, whole: the code is its own column (and a long code looked like a key to redaction)
    assert {r["error_message"] for r in failed} == {"ARR_Amount__c must not be negative"}

    second = make_runner(config, sim_state, job_name=name).run(context())
    assert second.status == "succeeded" and second.unchanged == 40 and second.exit_code == 0
    assert sim_state.calls()["upsert"] == 1

    forced = make_runner(config, sim_state, job_name=name).run(context(force=True))
    assert forced.permanently_failed == 4 and forced.new_permanent_failures == 0 and forced.exit_code == 0
    assert sim_state.calls()["upsert"] == 2 and len(sim_state.records(OBJ)) == 36


@pytest.mark.parametrize("changed,message", [
    ({"Product_Line__c": None}, "owned field Product_Line__c does not exist"),
    ({"ARR_Amount__c": FieldSpec("ARR_Amount__c", type="currency", precision=16, scale=2, updateable=False)},
     "owned field ARR_Amount__c is not updateable"),  # FLS / CRUD denial
])
def test_preflight_drift_fails_the_run_before_any_write(bq_client, make_runner, changed, message):
    state = NexusCrmState()
    deploy(state, **{k: v for k, v in changed.items() if v is not None})
    for name in (k for k, v in changed.items() if v is None):
        state.alter_field(OBJ, name, drop=True)
    result = make_runner(make_config(seed(bq_client)), state, job_name=job()).run(context())
    assert result.status == "failed" and result.exit_code == 1
    assert message in result.error_message
    assert state.calls().get("upsert", 0) == 0 and result.selected == 0


@pytest.mark.parametrize("change,message", [
    ({"type": "double"}, "owned field ARR_Amount__c has type 'double' in the CRM, the job declares 'currency'"),
    ({"precision": 18, "scale": 0}, "owned field ARR_Amount__c has precision 18 in the CRM, the job declares 16"),
    ({"scale": 4}, "owned field ARR_Amount__c has scale 4 in the CRM, the job declares 2"),
    ({"nillable": False}, "owned field ARR_Amount__c has nillable False in the CRM, the job declares True"),
])
def test_field_contract_drift_fails_before_any_write_and_leaves_the_rows_eligible(bq_client, make_runner, sim_state,
                                                                                  change, message):
    source, name = seed(bq_client, rows=30), job()
    config = make_config(source, batch_size=10)
    assert make_runner(config, sim_state, job_name=name).run(context()).succeeded == 30
    bq_client.query(f"UPDATE `{source}.month_end_arr` SET arr_amount = arr_amount + 1 WHERE TRUE").result()
    sim_state.alter_field(OBJ, "ARR_Amount__c", **change)  # an admin changes the field
    drifted = make_runner(config, sim_state, job_name=name)
    result = drifted.run(context())
    assert result.status == "failed" and result.exit_code == 1 and message in result.error_message
    assert sim_state.calls()["upsert"] == 3  # the first run's only
    assert {r["status"] for r in drifted.ledger.record_rows()} == {"succeeded"}
    sim_state.alter_field(OBJ, "ARR_Amount__c", type="currency", precision=16, scale=2, nillable=True)  # fixed
    fixed = make_runner(config, sim_state, job_name=name).run(context())
    assert fixed.status == "succeeded" and fixed.succeeded == 30


def test_a_text_field_shorter_in_the_crm_is_drift_too(bq_client, make_runner):
    state = deploy(NexusCrmState(), Account_External_Id__c=FieldSpec("Account_External_Id__c", length=10))
    result = make_runner(make_config(seed(bq_client)), state, job_name=job()).run(context())
    assert result.status == "failed"
    assert "owned field Account_External_Id__c has length 10 in the CRM, the job declares 18" in result.error_message
    assert state.calls().get("upsert", 0) == 0


def test_missing_object_fails_preflight(bq_client, make_runner):
    state = NexusCrmState()
    result = make_runner(make_config(seed(bq_client)), state, job_name=job()).run(context())
    assert result.status == "failed" and "object does not exist" in result.error_message


def test_crm_unique_conflict_is_permanent_and_blocking(bq_client, make_runner):
    state = deploy(NexusCrmState(), Account_External_Id__c=FieldSpec("Account_External_Id__c", length=18, unique=True))
    result = make_runner(make_config(seed(bq_client, rows=24)), state, job_name=job()).run(context())
    # 2 accounts x 12 months: the first month of each account is created, the rest conflict.
    assert result.succeeded == 2 and result.permanently_failed == 22
    assert result.blocking_failures == 22 and result.exit_code == 2


def test_duplicate_and_null_source_keys_fail_closed(bq_client, make_runner, sim_state):
    source = seed(bq_client, rows=24)
    bq_client.query(f"INSERT INTO `{source}.month_end_arr` SELECT * FROM `{source}.month_end_arr` "
                    "WHERE month_start = DATE '2025-01-01'").result()
    name = job()
    result = make_runner(make_config(source), sim_state, job_name=name).run(context())
    assert result.status == "failed" and "2 duplicate external IDs" in result.error_message
    assert sim_state.calls().get("upsert", 0) == 0
    # the candidate table existed (the check ran on it) and was deleted in cleanup
    assert not [t for t in bq_client.list_tables("wb_control") if t.table_id.startswith(f"wb_candidates_{name}")]


def test_malformed_response_leaves_every_record_retryable_and_replay_does_not_duplicate(bq_client, make_runner, sim_state):
    config = make_config(seed(bq_client), batch_size=10)
    name = job()
    sim_state.faults.push(Fault.malformed_json())
    first_runner = make_runner(config, sim_state, job_name=name)
    first = first_runner.run(context())
    assert (first.succeeded, first.retryable_failed) == (20, 10)
    assert {r["error_code"] for r in records_by_status(first_runner)["retryable_failed"]} == {"UNACCOUNTED"}
    ids_before = {r["Month_End_ARR_Key__c"]: r["Id"] for r in sim_state.records(OBJ)}
    assert len(ids_before) == 30  # the simulator applied the batch it answered badly
    replay = make_runner(config, sim_state, job_name=name).run(context(retry_failed=True))
    assert replay.succeeded == 10
    assert {r["Month_End_ARR_Key__c"]: r["Id"] for r in sim_state.records(OBJ)} == ids_before


def test_response_missing_one_record_marks_only_it_retryable(bq_client, make_runner, sim_state):
    sim_state.faults.push(Fault.drop_result("001000000000000:2025-05"))
    runner = make_runner(make_config(seed(bq_client), batch_size=10), sim_state, job_name=job())
    result = runner.run(context())
    assert (result.succeeded, result.retryable_failed) == (29, 1)
    (row,) = records_by_status(runner)["retryable_failed"]
    assert row["external_id"] == "001000000000000:2025-05" and row["error_code"] == "UNACCOUNTED"


def test_timeout_after_the_server_applied_the_write_is_retried_without_duplicates(bq_client, make_runner, sim_state):
    sim_state.faults.push(Fault.timeout_after_apply())
    result = make_runner(make_config(seed(bq_client), batch_size=10), sim_state, job_name=job()).run(context())
    assert result.status == "succeeded" and result.crm_calls == 4
    keys = [r["Month_End_ARR_Key__c"] for r in sim_state.records(OBJ)]
    assert len(keys) == len(set(keys)) == 30


def test_lease_loss_stops_before_the_next_batch(bq_client, make_runner, sim_state, control_dsn):
    name = job()
    runner = make_runner(make_config(seed(bq_client), batch_size=10), sim_state, job_name=name)
    original = runner.crm_factory

    def stealing_factory(loaded):
        client = original(loaded)
        upsert = client.upsert_batch

        def upsert_then_lose_lease(*args, **kwargs):
            outcome = upsert(*args, **kwargs)
            with connect(control_dsn) as other:
                other.execute("UPDATE leases SET fencing_token = nextval('fencing_tokens'), owner_id = 'thief' "
                              "WHERE lease_name = %s", (f"writeback:{name}",))
            return outcome

        client.upsert_batch = upsert_then_lose_lease
        return client

    runner.crm_factory = stealing_factory
    result = runner.run(context("lost-1"))
    assert result.status == "failed" and result.exit_code == 1 and "lease" in result.error_message
    assert sim_state.calls()["upsert"] == 1
    assert runner.ledger.record_rows() == []  # state left to the current holder
    evidence = runner.ledger.conn.execute(
        "SELECT count(*) FROM outbound_record_attempts WHERE run_id = 'lost-1'").fetchone()[0]
    assert evidence == 10
    assert runner.ledger.conn.execute("SELECT owner_run_id FROM outbound_job_leases WHERE job_name = %s",
                                      (name,)).fetchone() == ("thief",)  # the loser did not release it


def test_dry_run_writes_nothing(bq_client, make_runner, sim_state, control_conn):
    name = job()
    runner = make_runner(make_config(seed(bq_client)), sim_state, job_name=name)
    result = runner.run(context("dry-1", dry_run=True))
    assert result.status == "dry_run" and result.exit_code == 0 and result.would_write == 30
    assert sim_state.calls().get("upsert", 0) == 0 and runner.ledger.record_rows() == []
    assert control_conn.execute("SELECT count(*) FROM leases WHERE lease_name = %s", (f"writeback:{name}",)).fetchone() == (0,)


def test_source_rows_disappearing_never_delete_crm_records(bq_client, make_runner, sim_state):
    source = seed(bq_client, rows=24)
    name = job()
    config = make_config(source)
    assert make_runner(config, sim_state, job_name=name).run(context()).succeeded == 24
    bq_client.query(f"DELETE FROM `{source}.month_end_arr` WHERE month_start > DATE '2025-06-01'").result()
    runner = make_runner(config, sim_state, job_name=name)
    result = runner.run(context())
    assert result.status == "succeeded" and result.selected == 12 and result.unchanged == 12
    assert len(sim_state.records(OBJ)) == 24  # delete_policy: ignore
    assert len(runner.ledger.record_rows()) == 24


def test_ledger_failure_after_a_crm_request_stops_the_run_after_the_batch_in_flight(bq_client, make_runner,
                                                                                      sim_state, monkeypatch):
    import psycopg

    from nexus_pipelines.writeback.ledger import Ledger

    runner = make_runner(make_config(seed(bq_client), batch_size=10), sim_state, job_name=job())

    def broken_commit(*args, **kwargs):
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(Ledger, "commit_batch", broken_commit)
    result = runner.run(context())
    assert result.status == "failed" and result.exit_code == 1 and "OperationalError" in result.error_message
    # Batch 1's commit runs while batch 2 is in flight; no batch is sent after it failed.
    assert sim_state.calls()["upsert"] == 2
    assert result.succeeded == 0 and result.batches == 0


def test_a_canary_for_an_external_id_not_in_the_source_fails_naming_it(bq_client, make_runner, sim_state):
    wanted = ("001000000000000:2025-03", "001999999999999:2025-01", "nope")
    result = make_runner(make_config(seed(bq_client)), sim_state, job_name=job()).run(context(external_ids=wanted))
    assert result.status == "failed" and result.exit_code == 1
    assert "2 of the 3 external IDs asked for are not in the source: 001999999999999:2025-01, nope" \
        in result.error_message
    assert sim_state.calls().get("upsert", 0) == 0  # not even the one that exists


def test_a_canary_names_its_missing_external_id_even_when_another_is_duplicated_in_the_source(
        bq_client, make_runner, sim_state):
    source = seed(bq_client)
    bq_client.query(f"INSERT INTO `{source}.month_end_arr` SELECT * FROM `{source}.month_end_arr` "
                    "WHERE account_id = '001000000000000' AND month_start = DATE '2025-03-01'").result()
    wanted = ("001000000000000:2025-03", "001999999999999:2025-01")  # two rows selected for two ids asked for
    result = make_runner(make_config(source), sim_state, job_name=job()).run(context(external_ids=wanted))
    assert result.status == "failed" and result.exit_code == 1
    assert "1 of the 2 external IDs asked for are not in the source: 001999999999999:2025-01" in result.error_message
    assert sim_state.calls().get("upsert", 0) == 0


def test_a_nul_byte_in_a_source_text_field_fails_the_mapping_check_before_any_write(bq_client, make_runner,
                                                                                   sim_state):
    source = seed(bq_client, rows=24)
    bq_client.query(f"UPDATE `{source}.month_end_arr` SET product_line = CONCAT('Cl', CHR(0), 'oud') "
                    "WHERE account_id = '001000000000001' AND month_start = DATE '2025-04-01'").result()
    result = make_runner(make_config(source), sim_state, job_name=job()).run(context())
    assert result.status == "failed" and result.exit_code == 1
    assert "1 rows fail mapping: row 001000000000001:2025-04: Product_Line__c: contains a control character " \
           "(U+0000)" in result.error_message
    assert sim_state.calls().get("upsert", 0) == 0
