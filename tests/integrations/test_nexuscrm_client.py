"""Contract tests of the NexusCRM client against the project's NexusCRM simulator
(the contract tests of the writeback), in process through SimulatorTransport."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Iterator
from decimal import Decimal

import httpx
import pytest

from nexus_pipelines.integrations.nexuscrm import (
    ALLOCATION_RETRY_S,
    MAX_BATCH_RECORDS,
    ApiLimitExceeded,
    AuthError,
    FieldContract,
    NexusCrmClient,
    NexusCrmConfigError,
    NexusCrmCredentials,
    NexusCrmResponseError,
    PreflightError,
    is_blocking,
    is_retryable,
    parse_limit_info,
    parse_token,
    sanitize_error_message,
)
from nexus_pipelines.local.simulators.nexuscrm import (
    Fault,
    FieldSpec,
    NexusCrmState,
    SimulatorTransport,
)

OBJECT = "Arr_Snapshot__c"
KEY = "Source_Record_Id__c"
CONTRACT = (
    FieldContract(KEY, "string", length=64, nillable=False, external_id=True),
    FieldContract("Name__c", "string", length=20),
    FieldContract("Amount__c", "currency", precision=18, scale=2),
)
CLIENT_ID = "client-id-3MVG9"
SECRET = "client-secret-s3cr3t-value"


class Sleeps(list):
    """Injected sleep: records each delay instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


class UpperBoundRng:
    """Injected rng: records each uniform(a, b) range and returns its upper bound."""

    def __init__(self) -> None:
        self.ranges: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.ranges.append((a, b))
        return b


class SpyTransport(SimulatorTransport):
    """Keeps the Authorization headers and bodies sent, so tests know what went out."""

    def __init__(self, state: NexusCrmState) -> None:
        super().__init__(state)
        self.authorizations: list[str] = []
        self.bodies: list[bytes] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if "authorization" in request.headers:
            self.authorizations.append(request.headers["authorization"])
        self.bodies.append(request.read())
        return super().handle_request(request)


def negative_amount(record: dict) -> str | None:
    return "Amount must not be negative" if Decimal(str(record.get("Amount__c") or 0)) < 0 else None


def make_state() -> NexusCrmState:
    state = NexusCrmState(client_id=CLIENT_ID, client_secret=SECRET)
    state.define_object(
        OBJECT,
        [
            FieldSpec(KEY, external_id=True, unique=True, length=64, nillable=False),
            FieldSpec("Name__c", length=20),
            FieldSpec("Amount__c", type="currency", precision=18, scale=2),
            FieldSpec("Account_Hash__c", unique=True, length=64),
            FieldSpec("Formula__c", type="double", precision=18, scale=2, createable=False, updateable=False),
        ],
    )
    state.add_validation_rule(OBJECT, negative_amount)
    return state


def credentials() -> NexusCrmCredentials:
    return NexusCrmCredentials(base_url="https://nexuscrm.test", client_id=CLIENT_ID, client_secret=SECRET)


@pytest.fixture
def state() -> NexusCrmState:
    return make_state()


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def rng() -> UpperBoundRng:
    return UpperBoundRng()


@pytest.fixture
def client(state: NexusCrmState, sleeps: Sleeps, rng: UpperBoundRng) -> Iterator[NexusCrmClient]:
    transport = SimulatorTransport(state)
    with NexusCrmClient(
        credentials(), transport=transport, max_attempts=5, base_backoff_s=1.0, max_backoff_s=3.0, sleep=sleeps, rng=rng
    ) as c:
        yield c


def rec(external_id: str, **fields: object) -> dict:
    return {KEY: external_id, "Name__c": f"n-{external_id}", **fields}


def by_id(outcome) -> dict:
    return {r.external_id: r for r in outcome.results}


# -- credentials --------------------------------------------------------------------


def test_from_env_reads_named_variables_and_hides_the_secret() -> None:
    env = {"CRM_URL": "https://crm.example.com/", "CRM_ID": CLIENT_ID, "CRM_SECRET": SECRET}
    creds = NexusCrmCredentials.from_env("CRM_URL", "CRM_ID", "CRM_SECRET", allow_http=False, environ=env)
    assert creds.client_secret.get_secret_value() == SECRET
    assert SECRET not in repr(creds) and CLIENT_ID not in repr(creds) and SECRET not in str(creds)


def test_from_env_names_the_missing_variable_never_a_value() -> None:
    env = {"CRM_URL": "https://crm.example.com", "CRM_ID": CLIENT_ID}
    with pytest.raises(NexusCrmConfigError, match="CRM_SECRET is not set") as info:
        NexusCrmCredentials.from_env("CRM_URL", "CRM_ID", "CRM_SECRET", allow_http=False, environ=env)
    assert CLIENT_ID not in str(info.value) and "\n" not in str(info.value)


def test_plain_http_is_refused_unless_allowed() -> None:
    env = {"CRM_URL": "http://127.0.0.1:8080", "CRM_ID": CLIENT_ID, "CRM_SECRET": SECRET}
    with pytest.raises(NexusCrmConfigError, match="CRM_URL must use https"):
        NexusCrmCredentials.from_env("CRM_URL", "CRM_ID", "CRM_SECRET", allow_http=False, environ=env)
    with pytest.raises(NexusCrmConfigError, match="must use https"):
        NexusCrmCredentials(base_url="http://crm.example.com", client_id=CLIENT_ID, client_secret=SECRET)
    assert NexusCrmCredentials.from_env("CRM_URL", "CRM_ID", "CRM_SECRET", allow_http=True, environ=env).allow_http


# -- OAuth --------------------------------------------------------------------------


def test_token_exchange_then_reuse(client: NexusCrmClient, state: NexusCrmState) -> None:
    client.authenticate()
    client.describe(OBJECT)
    client.upsert_batch(OBJECT, KEY, [rec("E1")])
    assert state.calls() == {"token": 1, "describe": 1, "upsert": 1}
    assert client.call_counts() == {"token": 1, "token:status_200": 1, "describe": 1, "describe:status_200": 1,
                                    "upsert": 1, "upsert:status_200": 1}


def test_an_issued_access_token_is_redacted_wherever_it_is_echoed(client: NexusCrmClient,
                                                                  state: NexusCrmState) -> None:
    from nexus_pipelines.redaction import redact

    client.authenticate()
    (token,) = state._tokens  # the one access token the simulated org issued to this client
    assert redact(f"upstream echoed {token} back") == "upstream echoed [redacted] back"


def test_rejected_client_secret_is_one_line_auth_error() -> None:
    state = make_state()
    bad = NexusCrmCredentials(base_url="https://nexuscrm.test", client_id=CLIENT_ID, client_secret="wrong-secret")
    with NexusCrmClient(bad, transport=SimulatorTransport(state)) as c, pytest.raises(AuthError) as info:
        c.describe(OBJECT)
    message = str(info.value)
    assert "HTTP 400, invalid_client" in message and "wrong-secret" not in message and "\n" not in message
    assert state.calls() == {"token": 1}


def test_token_response_is_validated_without_echoing_it() -> None:
    with pytest.raises(NexusCrmResponseError, match=r"malformed \(access_token\)"):
        parse_token(b'{"instance_url": "https://nexuscrm.test", "token_type": "Bearer", "id": "x"}')
    with pytest.raises(NexusCrmResponseError, match=r"malformed \(token_type\)") as info:
        parse_token(b'{"access_token": "tok-123", "instance_url": "https://nexuscrm.test", "token_type": "MAC"}')
    assert "tok-123" not in str(info.value)
    token = parse_token(b'{"access_token": "tok-123", "instance_url": "https://x", "token_type": "bearer", "id": "i"}')
    assert "tok-123" not in repr(token)


# -- describe preflight -------------------------------------------------------------


def test_preflight_passes_and_returns_typed_describe(client: NexusCrmClient) -> None:
    describe = client.preflight(OBJECT, CONTRACT)
    key = describe.field(KEY)
    assert describe.name == OBJECT
    assert key is not None and key.external_id and key.unique and key.id_lookup and key.length == 64
    assert describe.field("Id") is not None and not describe.field("Id").createable


KEY_SPEC = FieldSpec(KEY, external_id=True, unique=True, length=64, nillable=False)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ([], "external id field Source_Record_Id__c does not exist"),
        ([FieldSpec(KEY, unique=True, id_lookup=True, length=64, nillable=False)], "is not marked External ID"),
        ([FieldSpec(KEY, external_id=True, length=64, nillable=False)],
         "external id field Source_Record_Id__c is not unique"),
        ([KEY_SPEC], "owned field Name__c does not exist"),
        ([KEY_SPEC, FieldSpec("Name__c", createable=False, length=20)], "owned field Name__c is not createable"),
        ([KEY_SPEC, FieldSpec("Name__c", updateable=False, length=20)], "owned field Name__c is not updateable"),
        # the field contract: type, length, precision/scale, nillability
        ([KEY_SPEC, FieldSpec("Name__c", length=30)], "owned field Name__c has length 30 in the CRM, the job declares 20"),
        ([KEY_SPEC, FieldSpec("Name__c", length=20, nillable=False)],
         "owned field Name__c has nillable False in the CRM, the job declares True"),
        ([KEY_SPEC, FieldSpec("Name__c", length=20), FieldSpec("Amount__c", type="double", precision=18, scale=2)],
         "owned field Amount__c has type 'double' in the CRM, the job declares 'currency'"),
        ([KEY_SPEC, FieldSpec("Name__c", length=20), FieldSpec("Amount__c", type="currency", precision=16, scale=4)],
         "owned field Amount__c has precision 16 in the CRM, the job declares 18"),
        ([KEY_SPEC, FieldSpec("Name__c", length=20), FieldSpec("Amount__c", type="string", length=18)],
         "owned field Amount__c has length 18 in the CRM, the job declares 0"),
    ],
)
def test_preflight_drift(fields, problem) -> None:
    state = NexusCrmState(client_id=CLIENT_ID, client_secret=SECRET)
    state.define_object(OBJECT, fields)
    with NexusCrmClient(credentials(), transport=SimulatorTransport(state)) as c, pytest.raises(PreflightError) as info:
        c.preflight(OBJECT, CONTRACT)
    assert problem in str(info.value)
    assert str(info.value).startswith(f"NexusCRM preflight failed for {OBJECT}: ") and "\n" not in str(info.value)
    assert state.calls().get("upsert", 0) == 0


def test_preflight_lists_every_problem_and_a_missing_object(client: NexusCrmClient) -> None:
    wrong = (FieldContract("Name__c", "string", length=20, nillable=False, external_id=True),
             FieldContract("Formula__c", "double", precision=18, scale=2), FieldContract("Gone__c", "date"))
    with pytest.raises(PreflightError) as info:
        client.preflight(OBJECT, wrong)
    assert info.value.problems == (
        "external id field Name__c is not marked External ID",
        "external id field Name__c is not unique",
        "external id field Name__c is not an idLookup field",
        "owned field Name__c has nillable True in the CRM, the job declares False",
        "owned field Formula__c is not createable",
        "owned field Formula__c is not updateable",
        "owned field Gone__c does not exist",
    )
    with pytest.raises(PreflightError, match="Missing__c: object does not exist"):
        client.preflight("Missing__c", CONTRACT)


# -- Composite Upsert ---------------------------------------------------------------


def test_mixed_success_batch_is_normalized_in_request_order(client: NexusCrmClient, state: NexusCrmState) -> None:
    records = [
        rec("E1", Amount__c=10),
        rec("E2", Name__c="x" * 21),
        rec("E3", Amount__c=Decimal("1.005")),
        rec("E4", Amount__c=-1),
        rec("E5", Formula__c=Decimal("2.0")),
        rec("E6", Amount__c=Decimal("12.50")),
    ]
    outcome = client.upsert_batch(OBJECT, KEY, records)
    assert [r.external_id for r in outcome.results] == ["E1", "E2", "E3", "E4", "E5", "E6"]
    assert [(r.success, r.error_code, r.retryable) for r in outcome.results] == [
        (True, None, False),
        (False, "STRING_TOO_LONG", False),
        (False, "NUMBER_OUTSIDE_VALID_RANGE", False),
        (False, "FIELD_CUSTOM_VALIDATION_EXCEPTION", False),
        (False, "INVALID_FIELD_FOR_INSERT_UPDATE", False),
        (True, None, False),
    ]
    results = by_id(outcome)
    assert results["E1"].crm_record_id == state.get_record(OBJECT, KEY, "E1")["Id"]
    assert len(results["E1"].crm_record_id) == 18 and results["E1"].crm_record_id.startswith("a0X")
    assert "Amount must not be negative" in results["E4"].error_message
    assert outcome.created_external_ids == {"E1", "E6"}
    assert (outcome.http_status, outcome.attempts, outcome.batch_error) == (200, 1, None)
    assert outcome.limit_info is not None and outcome.limit_info.max == 15000 and outcome.limit_info.used >= 1
    assert len(state.records(OBJECT)) == 2
    assert state.get_record(OBJECT, KEY, "E6")["Amount__c"] == Decimal("12.50")


def test_decimals_are_sent_as_exact_json_numbers(state: NexusCrmState) -> None:
    spy = SpyTransport(state)
    with NexusCrmClient(credentials(), transport=spy) as c:
        outcome = c.upsert_batch(OBJECT, KEY, [rec("E1", Amount__c=Decimal("9999999999999999.99"))])
    assert outcome.results[0].success
    assert b'"Amount__c":9999999999999999.99' in spy.bodies[-1]  # a float would have rounded it
    assert state.get_record(OBJECT, KEY, "E1")["Amount__c"] == Decimal("9999999999999999.99")


def test_unable_to_lock_row_is_retryable_and_the_rest_is_written(client: NexusCrmClient, state: NexusCrmState) -> None:
    state.faults.push(Fault.lock_rows("E2"))
    results = by_id(client.upsert_batch(OBJECT, KEY, [rec("E1"), rec("E2"), rec("E3")]))
    assert (results["E2"].error_code, results["E2"].retryable) == ("UNABLE_TO_LOCK_ROW", True)
    assert results["E1"].success and results["E3"].success
    assert state.get_record(OBJECT, KEY, "E2") is None


def test_second_upsert_of_same_external_id_updates_one_record(client: NexusCrmClient, state: NexusCrmState) -> None:
    first = client.upsert_batch(OBJECT, KEY, [rec("E1", Amount__c=1)])
    second = client.upsert_batch(OBJECT, KEY, [rec("E1", Amount__c=2)])
    assert first.created_external_ids == {"E1"} and second.created_external_ids == frozenset()
    assert first.results[0].crm_record_id == second.results[0].crm_record_id
    assert [r["Amount__c"] for r in state.records(OBJECT)] == [2]


def test_concurrent_clients_never_create_two_records(state: NexusCrmState) -> None:
    ids = [f"E{i}" for i in range(20)]
    outcomes = []

    def write() -> None:
        with NexusCrmClient(credentials(), transport=SimulatorTransport(state)) as c:
            outcomes.append(c.upsert_batch(OBJECT, KEY, [rec(x) for x in ids]))

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r[KEY] for r in state.records(OBJECT)) == sorted(ids)
    assert all(r.success for o in outcomes for r in o.results)
    assert sum(len(o.created_external_ids) for o in outcomes) == len(ids)


def test_unique_conflict_is_permanent_and_blocking(client: NexusCrmClient) -> None:
    outcome = client.upsert_batch(OBJECT, KEY, [rec("E1", Account_Hash__c="h"), rec("E2", Account_Hash__c="h")])
    failed = by_id(outcome)["E2"]
    assert (failed.error_code, failed.retryable) == ("DUPLICATE_VALUE", False)
    assert outcome.blocking_failures == (failed,)


@pytest.mark.parametrize(("records", "status", "code"), [
    ([rec("E1"), rec("E2", Bogus__c=1)], 400, "INVALID_FIELD"),
    ([rec("E1"), rec("E2", Name__c=42)], 400, "JSON_PARSER_ERROR"),
])
def test_a_rejected_whole_request_stops_the_run_and_leaves_every_record_retryable(
        client: NexusCrmClient, state: NexusCrmState, records, status, code) -> None:
    outcome = client.upsert_batch(OBJECT, KEY, records)
    assert (outcome.http_status, outcome.batch_error) == (status, code)
    assert all(not r.success and r.error_code == code and r.retryable for r in outcome.results)
    assert outcome.retry_after_s == 0.0  # eligible for the very next run, after the fix
    assert outcome.stop_reason and code in outcome.stop_reason and "\n" not in outcome.stop_reason
    assert state.records(OBJECT) == []


def test_a_missing_object_is_a_rejected_whole_request(client: NexusCrmClient) -> None:
    outcome = client.upsert_batch("Missing__c", KEY, [rec("E1"), rec("E2")])
    assert outcome.http_status == 404 and outcome.batch_error == "NOT_FOUND" and outcome.stop_reason
    assert all(not r.success and r.error_code == "NOT_FOUND" and r.retryable for r in outcome.results)


def test_batch_limit_and_arguments_are_checked_before_any_call(client: NexusCrmClient, state: NexusCrmState) -> None:
    with pytest.raises(ValueError, match="1..200 records, got 201"):
        client.upsert_batch(OBJECT, KEY, [rec(f"E{i}") for i in range(MAX_BATCH_RECORDS + 1)])
    with pytest.raises(ValueError, match="got 0"):
        client.upsert_batch(OBJECT, KEY, [])
    with pytest.raises(ValueError, match="must not repeat"):
        client.upsert_batch(OBJECT, KEY, [rec("E1"), rec("E1")])
    with pytest.raises(ValueError, match="record 1 has no string value"):
        client.upsert_batch(OBJECT, KEY, [rec("E1"), {"Name__c": "x"}])
    with pytest.raises(ValueError, match="not a NexusCRM API name"):
        client.upsert_batch("Obj/../x", KEY, [rec("E1")])
    assert state.calls() == {}
    outcome = client.upsert_batch(OBJECT, KEY, [rec(f"E{i:03d}") for i in range(MAX_BATCH_RECORDS)])
    assert len(outcome.results) == MAX_BATCH_RECORDS and all(r.success for r in outcome.results)


# -- failure policy -----------------------------------------------------------------


def test_401_refreshes_the_token_once_and_retries(client: NexusCrmClient, state: NexusCrmState) -> None:
    client.authenticate()
    state.faults.push(Fault.expire_token())
    outcome = client.upsert_batch(OBJECT, KEY, [rec("E1")])
    assert outcome.results[0].success and outcome.attempts == 2
    assert state.calls() == {"token": 2, "upsert": 2}


def test_two_401s_in_a_row_stop_the_run_and_leave_the_batch_unaccounted(client, state: NexusCrmState) -> None:
    state.faults.push(Fault.timeout_after_apply(), Fault.expire_token(), Fault.expire_token())
    outcome = client.upsert_batch(OBJECT, KEY, [rec("E1")])
    assert outcome.stop_reason and "rejected a freshly issued token on upsert" in outcome.stop_reason
    (result,) = outcome.results
    assert (result.success, result.error_code, result.retryable) == (False, "UNACCOUNTED", True)
    assert state.get_record(OBJECT, KEY, "E1") is not None  # the first attempt was applied
    assert state.calls() == {"token": 2, "upsert": 3} and outcome.attempts == 3


@pytest.mark.parametrize("between", [Fault.status(503), Fault.timeout_after_apply(), Fault.status(429)])
def test_a_token_that_expires_again_in_the_same_call_is_refreshed_again(client, state: NexusCrmState,
                                                                         between) -> None:
    client.authenticate()
    state.faults.push(Fault.expire_token(), between, Fault.expire_token())
    outcome = client.upsert_batch(OBJECT, KEY, [rec("E1")])
    assert outcome.results[0].success and outcome.stop_reason is None
    assert state.calls() == {"token": 3, "upsert": 4}
    assert outcome.attempts == 4 and len(state.records(OBJECT)) == 1


def test_429_honours_retry_after_seconds(client: NexusCrmClient, state: NexusCrmState, sleeps, rng) -> None:
    state.faults.push(Fault.status(429, retry_after=2))
    outcome = client.upsert_batch(OBJECT, KEY, [rec("E1")])
    assert outcome.results[0].success and outcome.attempts == 2
    assert sleeps == [2.0] and rng.ranges == []
    assert client.call_counts()["upsert:status_429"] == 1


def test_429_without_retry_after_uses_jittered_backoff(client, state: NexusCrmState, sleeps, rng) -> None:
    state.faults.push(Fault.status(429))
    assert client.upsert_batch(OBJECT, KEY, [rec("E1")]).results[0].success
    assert rng.ranges == [(0.0, 1.0)] and sleeps == [1.0]


def test_retry_after_beyond_the_cap_is_not_waited_out(client: NexusCrmClient, state: NexusCrmState, sleeps) -> None:
    state.faults.push(Fault.status(429, retry_after=120))
    outcome = client.upsert_batch(OBJECT, KEY, [rec("E1")])
    assert sleeps == [] and outcome.attempts == 1 and outcome.retry_after_s == 120.0
    result = outcome.results[0]
    assert (result.error_code, result.retryable, outcome.batch_error) == ("HTTP_429", True, "HTTP_429")


def test_5xx_backoff_is_capped_exponential_with_full_jitter(
    client: NexusCrmClient, state: NexusCrmState, sleeps: Sleeps, rng: UpperBoundRng
) -> None:
    state.faults.push(*[Fault.status(s) for s in (500, 502, 503, 504)])
    outcome = client.upsert_batch(OBJECT, KEY, [rec("E1")])
    assert outcome.results[0].success and outcome.attempts == 5
    assert rng.ranges == [(0.0, 1.0), (0.0, 2.0), (0.0, 3.0), (0.0, 3.0)]
    assert sum(v for k, v in client.call_counts().items() if k.startswith("upsert:status_5")) == 4


def test_jittered_delays_stay_within_bounds(state: NexusCrmState) -> None:
    sleeps = Sleeps()
    state.faults.push(*[Fault.status(503)] * 4)
    transport = SimulatorTransport(state)
    with NexusCrmClient(
        credentials(), transport=transport, base_backoff_s=0.5, max_backoff_s=1.5, sleep=sleeps, rng=random.Random(7)
    ) as c:
        c.upsert_batch(OBJECT, KEY, [rec("E1")])
    assert len(sleeps) == 4 and all(0 <= s <= cap for s, cap in zip(sleeps, [0.5, 1.0, 1.5, 1.5], strict=True))


def test_exhausted_transient_failures_return_retryable_results(client: NexusCrmClient, state: NexusCrmState) -> None:
    state.faults.push(*[Fault.status(503)] * 5)
    outcome = client.upsert_batch(OBJECT, KEY, [rec("E1"), rec("E2")])
    assert outcome.attempts == 5 and outcome.http_status == 503 and outcome.batch_error == "HTTP_503"
    assert all(r.error_code == "HTTP_503" and r.retryable and not r.success for r in outcome.results)
    assert state.records(OBJECT) == []


def test_response_missing_one_record(client: NexusCrmClient, state: NexusCrmState) -> None:
    state.faults.push(Fault.drop_result("E2"))
    results = by_id(client.upsert_batch(OBJECT, KEY, [rec("E1"), rec("E2"), rec("E3", Name__c="x" * 21)]))
    assert (results["E2"].error_code, results["E2"].retryable) == ("UNACCOUNTED", True)
    assert results["E1"].success and results["E3"].error_code == "STRING_TOO_LONG"
    # The write did happen: a replay updates it.
    replay = client.upsert_batch(OBJECT, KEY, [rec("E2")])
    assert replay.results[0].success and replay.created_external_ids == frozenset()


@pytest.mark.parametrize("crm_id,accepted", [
    ("a0M000000000001", True), ("a0M000000000001AAA", True),  # Salesforce ids: 15 or 18 letters and digits
    ("a0M00000000001", False), ("a0M000000000001AAAA", False), ("a0M00000000\x0001AAA", False),
    ("a0M-00000000001AA", False), ("", False),
])
def test_a_record_id_of_another_shape_leaves_its_record_unaccounted(client: NexusCrmClient, state: NexusCrmState,
                                                                   crm_id: str, accepted: bool) -> None:
    state.faults.push(Fault.alter_result("E2", id=crm_id))
    results = by_id(client.upsert_batch(OBJECT, KEY, [rec("E1"), rec("E2")]))
    assert results["E1"].success
    if accepted:
        assert results["E2"].success and results["E2"].crm_record_id == crm_id
    else:
        assert (results["E2"].error_code, results["E2"].retryable, results["E2"].crm_record_id) == (
            "UNACCOUNTED", True, None)


def test_a_shorter_result_list_leaves_every_record_unaccounted(client: NexusCrmClient, state: NexusCrmState) -> None:
    # Positions can no longer be trusted, so no reported result is believed.
    state.faults.push(Fault.drop_result("E1", keep_position=False))
    outcome = client.upsert_batch(OBJECT, KEY, [rec("E1"), rec("E2")])
    assert outcome.batch_error == "UNACCOUNTED"
    assert all(r.error_code == "UNACCOUNTED" and r.retryable for r in outcome.results)
    assert "1 results for 2 records" in outcome.results[0].error_message


def test_malformed_json_leaves_every_record_retryable(client: NexusCrmClient, state: NexusCrmState) -> None:
    state.faults.push(Fault.malformed_json())
    outcome = client.upsert_batch(OBJECT, KEY, [rec("E1"), rec("E2")])
    assert all(not r.success and r.error_code == "UNACCOUNTED" and r.retryable for r in outcome.results)
    assert outcome.http_status == 200 and outcome.batch_error == "UNACCOUNTED"
    assert len(state.records(OBJECT)) == 2


def test_timeout_after_the_server_applied_the_write(state: NexusCrmState, sleeps: Sleeps) -> None:
    state.faults.push(Fault.timeout_after_apply())
    with NexusCrmClient(credentials(), transport=SimulatorTransport(state), max_attempts=1, sleep=sleeps) as c:
        outcome = c.upsert_batch(OBJECT, KEY, [rec("E1"), rec("E2")])
        assert all(r.error_code == "TIMEOUT" and r.retryable for r in outcome.results)
        assert outcome.http_status is None and c.call_counts()["upsert:ReadTimeout"] == 1
        assert len(state.records(OBJECT)) == 2
        replay = c.upsert_batch(OBJECT, KEY, [rec("E1"), rec("E2")])
    assert all(r.success for r in replay.results) and replay.created_external_ids == frozenset()
    assert len(state.records(OBJECT)) == 2


def test_timeout_after_apply_is_retried_in_the_same_call_as_an_update(client, state: NexusCrmState) -> None:
    state.faults.push(Fault.timeout_after_apply())
    outcome = client.upsert_batch(OBJECT, KEY, [rec("E1")])
    assert outcome.results[0].success and outcome.attempts == 2 and outcome.created_external_ids == frozenset()
    assert len(state.records(OBJECT)) == 1


class CorruptFirstUpsertResponse(SimulatorTransport):
    """The write is applied, then its response body arrives corrupted (a content-encoding
    the body does not have), as a broken proxy or a truncated gzip stream would deliver it."""

    def __init__(self, state) -> None:
        super().__init__(state)
        self.corrupted = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if "/composite/" in request.url.path and not self.corrupted:
            self.corrupted += 1
            return httpx.Response(response.status_code, headers={"Content-Encoding": "gzip",
                                                                  "Content-Type": "application/json"},
                                  stream=httpx.ByteStream(b"not gzip"))
        return response


def test_an_undecodable_upsert_response_is_retried_not_raised() -> None:
    state = make_state()
    transport = CorruptFirstUpsertResponse(state)
    with NexusCrmClient(credentials(), transport=transport, max_attempts=3, sleep=lambda s: None) as client:
        outcome = client.upsert_batch(OBJECT, KEY, [rec("E1"), rec("E2")])
    assert transport.corrupted == 1 and outcome.attempts == 2
    assert [r.success for r in outcome.results] == [True, True]
    assert len(state.records(OBJECT)) == 2  # the replayed upsert updated, it did not duplicate


def test_an_undecodable_response_that_persists_leaves_the_batch_retryable() -> None:
    state = make_state()

    class AlwaysCorrupt(CorruptFirstUpsertResponse):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            self.corrupted = 0
            return super().handle_request(request)

    with NexusCrmClient(credentials(), transport=AlwaysCorrupt(state), max_attempts=2, sleep=lambda s: None) as client:
        outcome = client.upsert_batch(OBJECT, KEY, [rec("E1")])
    assert outcome.attempts == 2 and outcome.batch_error is not None
    assert [(r.success, r.retryable) for r in outcome.results] == [(False, True)]


@pytest.mark.parametrize(
    ("code", "retryable", "blocking"),
    [
        ("UNABLE_TO_LOCK_ROW", True, False),
        ("REQUEST_LIMIT_EXCEEDED", True, False),  # per record; the whole-request 403 stops the run
        ("SERVER_UNAVAILABLE", True, False),
        ("DUPLICATE_VALUE", False, True),
        ("DUPLICATE_EXTERNAL_ID", False, True),
        ("FIELD_CUSTOM_VALIDATION_EXCEPTION", False, False),
        ("INSUFFICIENT_ACCESS_OR_READONLY", False, False),
        ("REQUIRED_FIELD_MISSING", False, False),
        ("INVALID_TYPE_ON_FIELD_IN_RECORD", False, False),
        ("SOMETHING_NEW", False, False),
    ],
)
def test_error_classification(code: str, retryable: bool, blocking: bool) -> None:
    assert (is_retryable(code), is_blocking(code)) == (retryable, blocking)


def test_limit_info_parsing() -> None:
    assert parse_limit_info("api-usage=12/15000") is not None and parse_limit_info("api-usage=12/15000").used == 12
    assert parse_limit_info("garbage") is None and parse_limit_info(None) is None
    both = parse_limit_info("per-app-api-usage=17/250(appName=x); api-usage=25/5000")
    assert (both.used, both.max) == (25, 5000)


# -- the org's daily API allocation (403 REQUEST_LIMIT_EXCEEDED) -----------------------


def test_a_spent_allocation_on_upsert_stops_the_run_with_the_rows_retryable_after_a_wait(
        client: NexusCrmClient, state: NexusCrmState, sleeps) -> None:
    client.authenticate()
    state.api_limit = 0
    outcome = client.upsert_batch(OBJECT, KEY, [rec("E1"), rec("E2")])
    assert outcome.attempts == 1 and sleeps == []  # not retried: it would only spend more
    assert (outcome.http_status, outcome.batch_error) == (403, "REQUEST_LIMIT_EXCEEDED")
    assert all(r.retryable and r.error_code == "REQUEST_LIMIT_EXCEEDED" for r in outcome.results)
    assert outcome.retry_after_s == ALLOCATION_RETRY_S
    assert outcome.stop_reason and "daily API allocation is spent (api-usage=0/0)" in outcome.stop_reason
    assert state.records(OBJECT) == []


def test_a_spent_allocation_on_token_or_describe_is_one_clear_error(state: NexusCrmState) -> None:
    state.set_api_usage(state.api_limit)
    with NexusCrmClient(credentials(), transport=SimulatorTransport(state)) as c:
        with pytest.raises(ApiLimitExceeded, match="daily API allocation is spent"):
            c.authenticate()
    state.set_api_usage(state.api_limit - 1)
    with NexusCrmClient(credentials(), transport=SimulatorTransport(state)) as c:
        c.describe(OBJECT)
        assert c.api_usage is not None and (c.api_usage.used, c.api_usage.max) == (15000, 15000)
        with pytest.raises(ApiLimitExceeded) as info:
            c.describe(OBJECT)
    assert "\n" not in str(info.value)


# -- the shared HTTP core ---------------------------------------------------------------


def test_a_token_naming_another_instance_origin_is_refused_before_any_data_call(state: NexusCrmState) -> None:
    class OtherInstance(SimulatorTransport):
        def handle_request(self, request):
            response = super().handle_request(request)
            if request.url.path.endswith("/token") and response.status_code == 200:
                body = {**response.json(), "instance_url": "https://elsewhere.test"}
                return httpx.Response(200, json=body, request=request)
            return response

    with NexusCrmClient(credentials(), transport=OtherInstance(state)) as c, pytest.raises(NexusCrmResponseError,
                                                                                          match="another origin"):
        c.describe(OBJECT)
    assert state.calls() == {"token": 1}


def test_redirects_are_never_followed(state: NexusCrmState) -> None:
    class Moved(SimulatorTransport):
        def handle_request(self, request):
            if "/composite/" in request.url.path:
                return httpx.Response(302, headers={"Location": "https://nexuscrm.test/other"}, request=request)
            return super().handle_request(request)

    with NexusCrmClient(credentials(), transport=Moved(state)) as c:
        outcome = c.upsert_batch(OBJECT, KEY, [rec("E1")])
        assert c.call_counts()["upsert"] == 1
    assert outcome.http_status == 302 and outcome.stop_reason and outcome.results[0].retryable


# -- redaction ----------------------------------------------------------------------


def test_sanitize_error_message() -> None:
    text = "failed for jane.doe+x@example.com with Authorization: Bearer 00D!abc.def\nsecond line " + "word " * 200
    clean = sanitize_error_message(text)
    assert "jane.doe" not in clean and "00D!abc" not in clean and "\n" not in clean
    assert "[email]" in clean and "[redacted]" in clean and len(clean) == 500


def test_credentials_and_tokens_never_reach_repr_exceptions_or_logs(caplog, state: NexusCrmState) -> None:
    caplog.set_level(logging.DEBUG)
    spy = SpyTransport(state)
    state.faults.push(Fault.expire_token(), Fault.status(429), Fault.timeout_after_apply())
    errors = []
    with NexusCrmClient(credentials(), transport=spy, max_attempts=2, sleep=Sleeps()) as c:
        c.preflight(OBJECT, CONTRACT)
        outcome = c.upsert_batch(OBJECT, KEY, [rec("E1")])
        state.faults.push(Fault.expire_token(), Fault.expire_token())
        refused = c.upsert_batch(OBJECT, KEY, [rec("E1")])
        texts = [repr(c), repr(credentials()), str(credentials()), repr(refused), repr(c._http.auth)]
    bad = NexusCrmCredentials(base_url="https://nexuscrm.test", client_id=CLIENT_ID, client_secret="another-secret")
    with NexusCrmClient(bad, transport=spy) as c:
        try:
            c.authenticate()
        except AuthError as exc:
            errors.append(exc)
    assert len(errors) == 1 and outcome.batch_error == "TIMEOUT" and refused.stop_reason
    tokens = {a.split(" ", 1)[1] for a in spy.authorizations}
    assert len(tokens) >= 3
    haystack = "\n".join([caplog.text, *texts, *(str(e) for e in errors), *(repr(e) for e in errors), repr(outcome)])
    assert "nexuscrm upsert HTTP_429 on attempt 1/2" in caplog.text  # the logs are there, just clean
    for secret in [SECRET, CLIENT_ID, "another-secret", *tokens]:
        assert secret not in haystack


# -- read back ----------------------------------------------------------------------

def test_created_records_are_read_back_by_external_id_in_one_query(client: NexusCrmClient, state: NexusCrmState) -> None:
    odd = ["E1", "it's", "back\\slash", "line\nbreak"]
    client.upsert_batch(OBJECT, KEY, [rec(x) for x in odd])
    found, calls = client.ids_by_external_id(OBJECT, KEY, [*odd, "absent"])
    assert found == {r[KEY]: r["Id"] for r in state.records(OBJECT)} and set(found) == set(odd)
    assert calls == 1 and state.calls()["query"] == 1


def test_a_refused_or_malformed_read_back_is_one_line_error(client: NexusCrmClient, state: NexusCrmState) -> None:
    with pytest.raises(NexusCrmResponseError, match=r"^NexusCRM query of Nope__c by external id failed \(HTTP 400 "
                                                    r"INVALID_TYPE: sObject type 'Nope__c' is not supported\.\)$"):
        client.ids_by_external_id("Nope__c", KEY, ["E1"])
    with pytest.raises(ValueError):
        client.ids_by_external_id(OBJECT, "Bad field", ["E1"])  # an API name is checked before any call


def test_a_read_back_answer_without_a_valid_id_is_refused() -> None:
    state = make_state()

    class NoIds(SimulatorTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = super().handle_request(request)
            if request.url.path.endswith("/query"):
                return httpx.Response(200, json={"totalSize": 1, "done": True, "records": [{KEY: "E1", "Id": "x"}]},
                                      request=request)
            return response

    with NexusCrmClient(credentials(), transport=NoIds(state), sleep=lambda s: None) as client:
        with pytest.raises(NexusCrmResponseError, match="a record without a valid Id"):
            client.ids_by_external_id(OBJECT, KEY, ["E1"])
