"""The NexusCRM simulator speaks the Salesforce wire shapes the client relies on, in process
and over real HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from nexus_pipelines.integrations.nexuscrm import NexusCrmClient, NexusCrmCredentials
from nexus_pipelines.local.simulators.nexuscrm import (
    Fault,
    FieldSpec,
    NexusCrmState,
    RequestLogEntry,
    SimulatorTransport,
    build_nexuscrm_app,
    serve_in_thread,
)

OBJECT = "Invoice__c"
KEY = "Ext_Id__c"
BASE = "https://nexuscrm.test"
UPSERT_PATH = f"/services/data/v63.0/composite/sobjects/{OBJECT}/{KEY}"


@pytest.fixture
def state() -> NexusCrmState:
    state = NexusCrmState(client_id="cid", client_secret="csecret")
    state.define_object(
        OBJECT,
        [
            FieldSpec(KEY, external_id=True, unique=True, length=32),
            FieldSpec("Title__c", length=5),
            FieldSpec("Created_Only__c", updateable=False),
        ],
        key_prefix="a0Z",
    )
    state.add_validation_rule(OBJECT, lambda r: "Title must not be 'bad'" if r.get("Title__c") == "bad" else None)
    return state


@pytest.fixture
def http(state: NexusCrmState) -> Iterator[httpx.Client]:
    with httpx.Client(transport=SimulatorTransport(state), base_url=BASE) as client:
        yield client


def token(http: httpx.Client) -> str:
    form = {"grant_type": "client_credentials", "client_id": "cid", "client_secret": "csecret"}
    response = http.post("/services/oauth2/token", data=form)
    assert response.status_code == 200
    return response.json()["access_token"]


def upsert(http: httpx.Client, tok: str, records: list[dict], path: str = UPSERT_PATH) -> httpx.Response:
    body = {"allOrNone": False, "records": [{"attributes": {"type": OBJECT}, **r} for r in records]}
    return http.patch(path, json=body, headers={"Authorization": f"Bearer {tok}"})


def test_token_endpoint(http: httpx.Client) -> None:
    form = {"grant_type": "client_credentials", "client_id": "cid", "client_secret": "csecret"}
    ok = http.post("/services/oauth2/token", data=form).json()
    assert ok["token_type"] == "Bearer" and ok["instance_url"] == BASE and ok["access_token"]
    wrong = http.post("/services/oauth2/token", data={**form, "client_secret": "nope"})
    assert (wrong.status_code, wrong.json()["error"]) == (400, "invalid_client")
    grant = http.post("/services/oauth2/token", data={**form, "grant_type": "password"})
    assert (grant.status_code, grant.json()["error"]) == (400, "unsupported_grant_type")


def test_describe_needs_a_valid_token_and_lists_fields(http: httpx.Client, state: NexusCrmState) -> None:
    path = f"/services/data/v63.0/sobjects/{OBJECT}/describe"
    assert http.get(path).json() == [{"errorCode": "INVALID_SESSION_ID", "message": "Session expired or invalid"}]
    tok = token(http)
    response = http.get(path, headers={"Authorization": f"Bearer {tok}"})
    fields = {f["name"]: f for f in response.json()["fields"]}
    assert set(fields) == {"Id", "CreatedDate", "LastModifiedDate", KEY, "Title__c", "Created_Only__c"}
    assert fields[KEY]["externalId"] and fields[KEY]["idLookup"] and fields[KEY]["unique"]
    assert not fields["Id"]["createable"] and not fields["CreatedDate"]["updateable"]
    assert response.headers["Sforce-Limit-Info"] == "api-usage=1/15000"
    missing = http.get("/services/data/v63.0/sobjects/Nope__c/describe", headers={"Authorization": f"Bearer {tok}"})
    assert missing.status_code == 404
    state.expire_tokens()
    assert http.get(path, headers={"Authorization": f"Bearer {tok}"}).status_code == 401


def test_upsert_response_has_the_salesforce_shape(http: httpx.Client, state: NexusCrmState) -> None:
    tok = token(http)
    first = upsert(http, tok, [{KEY: "A", "Title__c": "ok"}, {KEY: "B", "Title__c": "toolong"}])
    assert first.status_code == 200
    created, failed = first.json()
    assert set(created) == {"id", "success", "errors", "created"} and created["created"] is True
    assert created["id"].startswith("a0Z") and len(created["id"]) == 18
    assert failed == {
        "success": False,
        "errors": [
            {
                "statusCode": "STRING_TOO_LONG",
                "message": "Title__c: data value too large (max length=5)",
                "fields": ["Title__c"],
            }
        ],
    }
    second = upsert(http, tok, [{KEY: "A", "Title__c": "new"}]).json()
    assert second == [{"id": created["id"], "success": True, "errors": [], "created": False}]
    record = state.get_record(OBJECT, KEY, "A")
    assert record["Title__c"] == "new" and record["CreatedDate"] <= record["LastModifiedDate"]
    assert len(state.records(OBJECT)) == 1


@pytest.mark.parametrize(
    ("records", "code"),
    [
        ([{KEY: "A", "Nope__c": 1}], "INVALID_FIELD"),
        ([{KEY: "A", "Id": "a0Z000000000000001"}], "INVALID_FIELD_FOR_INSERT_UPDATE"),
        ([{KEY: "A", "Title__c": "bad"}], "FIELD_CUSTOM_VALIDATION_EXCEPTION"),
        ([{"Title__c": "x"}], "MISSING_ARGUMENT"),
        ([{KEY: "A"}, {KEY: "A"}], "DUPLICATE_VALUE"),
    ],
)
def test_per_record_validation(http: httpx.Client, state: NexusCrmState, records: list[dict], code: str) -> None:
    items = upsert(http, token(http), records).json()
    assert {item["errors"][0]["statusCode"] for item in items} == {code}
    assert state.records(OBJECT) == []


def test_non_updateable_field_is_accepted_on_insert_only(http: httpx.Client) -> None:
    tok = token(http)
    assert upsert(http, tok, [{KEY: "A", "Created_Only__c": "x"}]).json()[0]["success"]
    item = upsert(http, tok, [{KEY: "A", "Created_Only__c": "y"}]).json()[0]
    assert item["errors"][0]["statusCode"] == "INVALID_FIELD_FOR_INSERT_UPDATE"


def test_whole_request_errors(http: httpx.Client) -> None:
    tok = token(http)
    too_many = upsert(http, tok, [{KEY: f"E{i}"} for i in range(201)])
    assert (too_many.status_code, too_many.json()[0]["errorCode"]) == (400, "EXCEEDED_ID_LIMIT")
    not_key = upsert(http, tok, [{KEY: "A"}], path=f"/services/data/v63.0/composite/sobjects/{OBJECT}/Title__c")
    assert (not_key.status_code, not_key.json()[0]["errorCode"]) == (400, "INVALID_FIELD")
    old_version = upsert(http, tok, [{KEY: "A"}], path=f"/services/data/v62.0/composite/sobjects/{OBJECT}/{KEY}")
    assert old_version.status_code == 404


def test_faults_are_fifo_and_consumed_only_by_upserts(http: httpx.Client, state: NexusCrmState) -> None:
    tok = token(http)
    state.faults.push(Fault.status(429, retry_after=3), Fault.status(503))
    http.get(f"/services/data/v63.0/sobjects/{OBJECT}/describe", headers={"Authorization": f"Bearer {tok}"})
    first = upsert(http, tok, [{KEY: "A"}])
    assert (first.status_code, first.headers["Retry-After"]) == (429, "3")
    assert first.json()[0]["errorCode"] == "REQUEST_LIMIT_EXCEEDED"
    second = upsert(http, tok, [{KEY: "A"}])
    assert (second.status_code, "retry-after" in second.headers) == (503, False)
    assert upsert(http, tok, [{KEY: "A"}]).status_code == 200
    assert len(state.faults) == 0 and len(state.records(OBJECT)) == 1


def test_expire_token_fault_gives_invalid_session(http: httpx.Client, state: NexusCrmState) -> None:
    tok = token(http)
    state.faults.push(Fault.expire_token(), Fault.lock_rows("A"))
    assert upsert(http, tok, [{KEY: "A"}]).json()[0]["errorCode"] == "INVALID_SESSION_ID"
    # The fault behind the expiry waits for the next authorized upsert.
    locked = upsert(http, token(http), [{KEY: "A"}, {KEY: "B"}]).json()
    assert [i["success"] for i in locked] == [False, True]
    assert locked[0]["errors"][0]["statusCode"] == "UNABLE_TO_LOCK_ROW"


def test_after_apply_faults_store_the_write(http: httpx.Client, state: NexusCrmState) -> None:
    tok = token(http)
    state.faults.push(
        Fault.malformed_json(),
        Fault.fail_after_apply(502),
        Fault.drop_result("C"),
        Fault.drop_result("D", keep_position=False),
    )
    malformed = upsert(http, tok, [{KEY: "A"}])
    with pytest.raises(ValueError):
        malformed.json()
    assert upsert(http, tok, [{KEY: "B"}]).status_code == 502
    assert upsert(http, tok, [{KEY: "B"}, {KEY: "C"}]).json()[1] is None
    assert len(upsert(http, tok, [{KEY: "D"}, {KEY: "E"}]).json()) == 1
    with pytest.raises(httpx.ReadTimeout):
        state.faults.push(Fault.timeout_after_apply())
        upsert(http, tok, [{KEY: "F"}])
    assert sorted(r[KEY] for r in state.records(OBJECT)) == ["A", "B", "C", "D", "E", "F"]


def test_concurrent_upserts_of_one_external_id_create_one_record(state: NexusCrmState) -> None:
    results: list[dict] = []

    def write() -> None:
        with httpx.Client(transport=SimulatorTransport(state), base_url=BASE) as client:
            results.extend(upsert(client, token(client), [{KEY: "SAME"}]).json())

    threads = [threading.Thread(target=write) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(state.records(OBJECT)) == 1
    assert sorted(r["created"] for r in results) == [False] * 7 + [True]
    assert len({r["id"] for r in results}) == 1


def test_counters_and_request_log_carry_no_bodies(http: httpx.Client, state: NexusCrmState) -> None:
    tok = token(http)
    upsert(http, tok, [{KEY: "A", "Title__c": "hello"}, {KEY: "B"}])
    http.get("/nowhere")
    assert state.calls() == {"token": 1, "upsert": 1, "unknown": 1}
    assert state.request_log() == [
        RequestLogEntry("POST", "/services/oauth2/token", None),
        RequestLogEntry("PATCH", UPSERT_PATH, 2),
        RequestLogEntry("GET", "/nowhere", None),
    ]


def test_client_over_real_http(state: NexusCrmState) -> None:
    state.latency_s = 0.001
    url, stop = serve_in_thread(build_nexuscrm_app(state))
    try:
        credentials = NexusCrmCredentials(base_url=url, client_id="cid", client_secret="csecret", allow_http=True)
        timeout = httpx.Timeout(connect=2.0, read=0.2, write=2.0, pool=2.0)
        with NexusCrmClient(credentials, timeout=timeout, max_attempts=1) as client:
            client.preflight(OBJECT, KEY, {KEY, "Title__c"})
            first = client.upsert_batch(OBJECT, KEY, [{KEY: "A", "Title__c": "one"}, {KEY: "B", "Title__c": "toolong"}])
            assert [r.success for r in first.results] == [True, False] and first.created_external_ids == {"A"}
            assert first.limit_info is not None and first.limit_info.used == 2
            state.faults.push(Fault.timeout_after_apply(hang_s=0.4))
            lost = client.upsert_batch(OBJECT, KEY, [{KEY: "C"}])
            assert (lost.results[0].error_code, lost.results[0].retryable) == ("TIMEOUT", True)
            assert state.get_record(OBJECT, KEY, "C") is not None
            replay = client.upsert_batch(OBJECT, KEY, [{KEY: "C"}])
            assert replay.results[0].success and replay.created_external_ids == frozenset()
    finally:
        stop()
    assert state.calls() == {"token": 1, "describe": 1, "upsert": 3}
