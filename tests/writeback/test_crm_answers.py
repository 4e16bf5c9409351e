"""What the runner does with what NexusCRM answers, beyond a plain mixed batch: the org's
daily API allocation, repeated token expiry, a rejected whole request and a response whose
positions contradict the ledger (real Postgres, emulator, simulator)."""

from __future__ import annotations

from datetime import timedelta

from nexus_pipelines.local.simulators.nexuscrm import Fault

from .support import OBJ, context, job, make_config, seed


def by_status(runner) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in runner.ledger.record_rows():
        out.setdefault(r["status"], []).append(r)
    return out


def test_a_spent_api_allocation_stops_the_run_before_the_next_batch(bq_client, make_runner, sim_state):
    config = make_config(seed(bq_client, 50), batch_size=10)
    sim_state.api_limit = 5  # describe, then two batches of new records: each an upsert and its read-back
    runner = make_runner(config, sim_state, job_name=job())
    ctx = context()
    result = runner.run(ctx)
    assert result.status == "failed" and result.exit_code == 1
    assert "daily API allocation is spent (api-usage=5/5)" in result.error_message
    assert "\n" not in result.error_message
    assert sim_state.calls()["upsert"] == 3  # two written, the third refused; batches 4 and 5 never sent
    rows = by_status(runner)
    assert len(rows["succeeded"]) == 20 and len(runner.ledger.record_rows()) == 30  # unsent rows untouched
    refused = rows["retryable_failed"]
    assert len(refused) == 10 and {r["error_code"] for r in refused} == {"REQUEST_LIMIT_EXCEEDED"}
    # the retry time reflects the allocation, not a one-second backoff; never permanent
    assert all(r["next_retry_at"] - r["updated_at"] >= timedelta(minutes=59) for r in refused)
    assert result.api_usage == "5/5"
    assert runner.ledger.run_row(ctx.run_id)["crm_api_usage"] == "5/5"


def test_an_allocation_spent_before_the_run_fails_it_at_the_token_in_one_line(bq_client, make_runner, sim_state):
    sim_state.set_api_usage(sim_state.api_limit)
    runner = make_runner(make_config(seed(bq_client)), sim_state, job_name=job())
    result = runner.run(context())
    assert result.status == "failed" and result.exit_code == 1 and "\n" not in result.error_message
    assert ("refused the token call with 403 REQUEST_LIMIT_EXCEEDED: the org's daily API allocation is spent "
            "(api-usage=15000/15000)") in result.error_message
    assert sim_state.calls() == {"token": 1} and runner.ledger.record_rows() == []
    assert result.api_usage == "15000/15000"


def test_the_job_stops_before_using_the_headroom_it_leaves_other_integrations(bq_client, make_runner, sim_state):
    config = make_config(seed(bq_client, 50), batch_size=10, api_headroom_percent=50)
    sim_state.api_limit = 10
    sim_state.set_api_usage(2)  # other integrations share the org's allocation
    runner = make_runner(config, sim_state, job_name=job())
    result = runner.run(context())
    # describe -> 3/10; batch 1 and its read-back -> 5/10; batch 2 of new records needs two
    # calls more, which would use the last 50%
    assert result.status == "failed" and result.exit_code == 1
    assert "50% of the org's API allocation" in result.error_message and "5/10" in result.error_message
    assert sim_state.calls()["upsert"] == 1 and sim_state.calls()["query"] == 1 and result.succeeded == 10
    assert len(runner.ledger.record_rows()) == 10  # nothing recorded for the rows never sent


def test_a_token_that_expires_again_during_retries_is_refreshed_again(bq_client, make_runner, sim_state):
    sim_state.faults.push(Fault.expire_token(), Fault.status(503), Fault.expire_token())
    result = make_runner(make_config(seed(bq_client), batch_size=10), sim_state, job_name=job()).run(context())
    assert result.status == "succeeded" and result.succeeded == 30
    assert sim_state.calls()["token"] == 3 and len(sim_state.records(OBJ)) == 30


def test_two_401s_in_a_row_fail_the_run_and_the_batch_in_flight_leaves_its_evidence(bq_client, make_runner,
                                                                                    sim_state):
    sim_state.faults.push(Fault.timeout_after_apply(), Fault.expire_token(), Fault.expire_token())
    runner = make_runner(make_config(seed(bq_client), batch_size=10), sim_state, job_name=job())
    ctx = context()
    result = runner.run(ctx)
    assert result.status == "failed" and "rejected a freshly issued token" in result.error_message
    (in_flight,) = by_status(runner).values()
    assert len(in_flight) == 10 and {r["error_code"] for r in in_flight} == {"UNACCOUNTED"}
    assert {r["status"] for r in in_flight} == {"retryable_failed"}
    attempts = runner.ledger.conn.execute(
        "SELECT count(*) FROM outbound_record_attempts WHERE run_id = %s", (ctx.run_id,)).fetchone()[0]
    assert attempts == 10 and sim_state.calls()["upsert"] == 3  # no second batch


def test_a_rejected_whole_request_stops_the_run_and_leaves_the_rows_eligible(bq_client, make_runner, sim_state):
    config, name = make_config(seed(bq_client), batch_size=10), job()
    sim_state.faults.push(Fault.reject_request("INVALID_FIELD", "No such column 'Renamed__c' on sobject"))
    runner = make_runner(config, sim_state, job_name=name)
    result = runner.run(context())
    assert result.status == "failed" and result.exit_code == 1
    assert "INVALID_FIELD" in result.error_message and "contract or code error" in result.error_message
    assert sim_state.calls()["upsert"] == 1 and result.permanently_failed == 0
    assert {r["status"] for r in runner.ledger.record_rows()} == {"retryable_failed"}
    after_fix = make_runner(config, sim_state, job_name=name).run(context())
    assert after_fix.status == "succeeded" and after_fix.succeeded == 30 and after_fix.unchanged == 0


def test_a_reordered_response_is_never_taken_as_success(bq_client, make_runner, sim_state):
    source, name = seed(bq_client, 30), job()
    config = make_config(source, batch_size=10)
    assert make_runner(config, sim_state, job_name=name).run(context()).succeeded == 30
    crm_ids = {r["Month_End_ARR_Key__c"]: r["Id"] for r in sim_state.records(OBJ)}
    bq_client.query(f"UPDATE `{source}.month_end_arr` SET arr_amount = arr_amount + 1 WHERE TRUE").result()
    sim_state.faults.push(Fault.reorder_results())
    runner = make_runner(config, sim_state, job_name=name)
    result = runner.run(context())
    assert result.status == "failed" and "contradicts the ledger" in result.error_message
    assert result.succeeded == 0 and result.blocking_failures == 10 and result.exit_code == 1
    rows = runner.ledger.record_rows()
    assert {r["external_id"]: r["crm_record_id"] for r in rows} == crm_ids  # no wrong CRM id recorded
    unaccounted = [r for r in rows if r["status"] == "retryable_failed"]
    assert len(unaccounted) == 10 and {r["error_code"] for r in unaccounted} == {"UNACCOUNTED"}
    replay = make_runner(config, sim_state, job_name=name).run(context(retry_failed=True))
    assert replay.succeeded == 10
    rerun = make_runner(config, sim_state, job_name=name).run(context())
    assert rerun.status == "succeeded" and rerun.succeeded == 20  # the rows never sent go out now


def test_control_characters_in_a_crm_error_message_reach_the_ledger_escaped(bq_client, make_runner, sim_state):
    rejected = "001000000000001:2025-02"
    sim_state.add_validation_rule(OBJ, lambda r: "ARR is\x00 not\x1b[2J allowed"
                                  if r["Month_End_ARR_Key__c"] == rejected else None)
    runner = make_runner(make_config(seed(bq_client), batch_size=10), sim_state, job_name=job())
    result = runner.run(context())
    assert result.status == "completed_with_errors" and (result.succeeded, result.permanently_failed) == (29, 1)
    (row,) = by_status(runner)["permanent_failed"]
    assert row["external_id"] == rejected and row["error_message"] == "ARR is\\u0000 not\\u001b[2J allowed"


def test_a_crm_record_id_of_the_wrong_shape_leaves_its_record_unaccounted_not_the_batch(bq_client, make_runner,
                                                                                        sim_state):
    garbled = "001000000000000:2025-02"  # in the first batch, which takes the fault
    sim_state.faults.push(Fault.alter_result(garbled, id="a0M\x00garbled"))
    runner = make_runner(make_config(seed(bq_client), batch_size=10), sim_state, job_name=job())
    result = runner.run(context())
    assert (result.succeeded, result.retryable_failed) == (29, 1)
    (row,) = by_status(runner)["retryable_failed"]
    assert (row["external_id"], row["error_code"], row["crm_record_id"]) == (garbled, "UNACCOUNTED", None)
    assert len(sim_state.records(OBJ)) == 30  # the write was applied: the next run finds it


def test_reversed_results_for_first_time_creates_are_read_back_and_never_believed(bq_client, make_runner,
                                                                                  sim_state):
    # Every fifth row has a negative ARR, which the CRM rejects: the first batch of ten new
    # records has two rejected, and its reversed answer says they succeeded with others' ids.
    config, name = make_config(seed(bq_client, 30, negative_every=5), batch_size=10), job()
    sim_state.faults.push(Fault.reverse_results())
    runner = make_runner(config, sim_state, job_name=name)
    result = runner.run(context())
    assert result.status == "failed" and "contradicts the ledger" in result.error_message
    assert "but NexusCRM holds" in result.error_message
    assert (result.succeeded, result.blocking_failures, result.read_back_calls) == (0, 10, 1)
    assert sim_state.calls()["upsert"] == 1 and sim_state.calls()["query"] == 1
    rows = runner.ledger.record_rows()
    assert len(rows) == 10
    assert {(r["status"], r["error_code"], r["crm_record_id"]) for r in rows} == {("retryable_failed", "UNACCOUNTED", None)}

    replay = make_runner(config, sim_state, job_name=name).run(context(retry_failed=True))
    assert (replay.succeeded, replay.permanently_failed, replay.read_back_calls) == (8, 2, 1)
    rerun = make_runner(config, sim_state, job_name=name).run(context())
    assert (rerun.succeeded, rerun.permanently_failed, rerun.read_back_calls) == (16, 4, 2)
    crm_ids = {r["Month_End_ARR_Key__c"]: r["Id"] for r in sim_state.records(OBJ)}
    states = by_status(runner)
    assert {r["external_id"]: r["crm_record_id"] for r in states["succeeded"]} == crm_ids and len(crm_ids) == 24
    assert len(states["permanent_failed"]) == 6 and not {r["external_id"] for r in states["permanent_failed"]} & set(crm_ids)


def test_only_batches_with_records_new_to_the_ledger_are_read_back(bq_client, make_runner, sim_state):
    source, name = seed(bq_client, 30), job()
    config = make_config(source, batch_size=10)
    first = make_runner(config, sim_state, job_name=name).run(context())
    assert (first.succeeded, first.batches, first.read_back_calls) == (30, 3, 1 * 3)
    bq_client.query(f"UPDATE `{source}.month_end_arr` SET arr_amount = arr_amount + 1 WHERE TRUE").result()
    update = make_runner(config, sim_state, job_name=name).run(context())
    assert (update.succeeded, update.read_back_calls) == (30, 0)  # the ledger holds every id: nothing to read
    assert sim_state.calls()["query"] == 3


def test_a_read_back_that_fails_leaves_the_batch_unaccounted(bq_client, make_runner, sim_state):
    config, name = make_config(seed(bq_client, 20), batch_size=10), job()
    sim_state.api_limit = 2  # describe, the first upsert, then the read-back is refused
    runner = make_runner(config, sim_state, job_name=name)
    result = runner.run(context())
    assert result.status == "failed" and "could not be read back" in result.error_message
    assert result.succeeded == 0 and sim_state.calls()["upsert"] == 1
    assert {(r["status"], r["error_code"]) for r in runner.ledger.record_rows()} == {("retryable_failed", "UNACCOUNTED")}
