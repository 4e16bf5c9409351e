"""The NexusCRM simulator speaks the Salesforce wire shapes the client relies on, in process
and over real HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from decimal import Decimal

import httpx
import pytest

from nexus_pipelines.integrations.nexuscrm import FieldContract, NexusCrmClient, NexusCrmCredentials
from nexus_pipelines.local.simulators.nexuscrm import (
    Fault,
    FieldSpec,
    NexusCrmState,
    RequestLogEntry,
    SimulatorTransport,
    build_nexuscrm_app,
)
from nexus_pipelines.local.simulators.http import serve_in_thread

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
            FieldSpec(KEY, external_id=True, unique=True, length=32, nillable=False),
            FieldSpec("Title__c", length=5),
            FieldSpec("Created_Only__c", updateable=False, length=10),
            FieldSpec("Amount__c", type="currency", precision=6, scale=2),
            FieldSpec("Rate__c", type="percent", precision=5, scale=2),
            FieldSpec("Weight__c", type="double", precision=8, scale=3),
            FieldSpec("Due__c", type="date"),
            FieldSpec("Sent_At__c", type="datetime"),
            FieldSpec("Paid__c", type="boolean", nillable=False),
            FieldSpec("Code__c", length=8, nillable=False),
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


def upsert(http: httpx.Client, tok: str, records: list[dict], path: str = UPSERT_PATH, *,
           all_or_none: bool = False) -> httpx.Response:
    body = {"allOrNone": all_or_none,
            "records": [{"attributes": {"type": OBJECT}, "Code__c": "c", **r} for r in records]}
    return http.patch(path, json=body, headers={"Authorization": f"Bearer {tok}"})


def upsert_raw(http: httpx.Client, tok: str, records_json: str) -> httpx.Response:
    """Records written as JSON text, so numbers keep their exact decimal digits."""
    return http.patch(UPSERT_PATH, content=f'{{"allOrNone": false, "records": [{records_json}]}}',
                      headers={"Authorization": f"Bearer {tok}", "Content-Type": "application/json"})


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
    assert set(fields) == {"Id", "CreatedDate", "LastModifiedDate", KEY, "Title__c", "Created_Only__c", "Amount__c",
                           "Rate__c", "Weight__c", "Due__c", "Sent_At__c", "Paid__c", "Code__c"}
    assert (fields["Amount__c"]["type"], fields["Amount__c"]["precision"], fields["Amount__c"]["scale"]) == (
        "currency", 6, 2)
    assert (fields["Title__c"]["type"], fields["Title__c"]["length"]) == ("string", 5)
    assert fields["Code__c"]["nillable"] is False and fields["Paid__c"]["defaultedOnCreate"] is True
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
    not_json = http.patch(UPSERT_PATH, content=b'{"records": [', headers={"Authorization": f"Bearer {tok}"})
    assert (not_json.status_code, not_json.json()[0]["errorCode"]) == (400, "JSON_PARSER_ERROR")


def test_an_unknown_field_fails_the_whole_request_and_writes_nothing(http: httpx.Client, state: NexusCrmState) -> None:
    response = upsert(http, token(http), [{KEY: "A"}, {KEY: "B", "Nope__c": 1}])
    assert response.status_code == 400
    (error,) = response.json()
    assert error["errorCode"] == "INVALID_FIELD" and "No such column 'Nope__c'" in error["message"]
    assert state.records(OBJECT) == []


@pytest.mark.parametrize(("field", "value_json"), [
    ("Title__c", "42"),  # a number in a string field
    ("Title__c", "true"),
    ("Amount__c", '"12.50"'),  # a number as text
    ("Amount__c", '"abc"'),
    ("Amount__c", "true"),
    ("Rate__c", '{"v": 1}'),
    ("Due__c", '"2025-13-01"'),
    ("Due__c", '"2025-02-30"'),
    ("Due__c", '"2025-1-5"'),
    ("Due__c", '"2025-01-01T00:00:00Z"'),
    ("Due__c", "20250101"),
    ("Sent_At__c", '"2025-01-01T00:00:00"'),  # no zone
    ("Sent_At__c", '"2025-01-01 00:00:00Z"'),
    ("Sent_At__c", '"2025-01-01T25:00:00Z"'),
    ("Sent_At__c", '"2025-01-01"'),
    ("Paid__c", '"true"'),
    ("Paid__c", "1"),
])
def test_a_value_of_the_wrong_type_or_format_fails_the_whole_request(http: httpx.Client, state: NexusCrmState,
                                                                     field: str, value_json: str) -> None:
    good = f'{{"attributes": {{"type": "{OBJECT}"}}, "{KEY}": "A", "Code__c": "c"}}'
    bad = f'{{"attributes": {{"type": "{OBJECT}"}}, "{KEY}": "B", "Code__c": "c", "{field}": {value_json}}}'
    response = upsert_raw(http, token(http), f"{good}, {bad}")
    assert response.status_code == 400, response.text
    assert response.json()[0]["errorCode"] == "JSON_PARSER_ERROR"
    assert state.records(OBJECT) == []


def test_values_in_the_documented_formats_are_accepted_exactly(http: httpx.Client, state: NexusCrmState) -> None:
    record = (f'{{"attributes": {{"type": "{OBJECT}"}}, "{KEY}": "A", "Code__c": "c", "Amount__c": 1234.50, '
              '"Rate__c": 12.5, "Weight__c": 7, "Due__c": "2024-02-29", "Sent_At__c": "2025-01-01T12:00:00.123+05:30", '
              '"Paid__c": true}')
    other = f'{{"attributes": {{"type": "{OBJECT}"}}, "{KEY}": "B", "Code__c": "c", "Sent_At__c": "2025-01-01T00:00:00Z"}}'
    response = upsert_raw(http, token(http), f"{record}, {other}")
    assert [item["success"] for item in response.json()] == [True, True], response.text
    stored = state.get_record(OBJECT, KEY, "A")
    assert stored["Amount__c"] == Decimal("1234.50") and stored["Paid__c"] is True
    assert state.get_record(OBJECT, KEY, "B")["Paid__c"] is False  # defaulted on create


@pytest.mark.parametrize(("field", "value", "code"), [
    ("Amount__c", "10000.00", "NUMBER_OUTSIDE_VALID_RANGE"),  # 5 integer digits; precision 6, scale 2 allows 4
    ("Amount__c", "12.345", "NUMBER_OUTSIDE_VALID_RANGE"),  # more decimals than the scale
    ("Rate__c", "-1000", "NUMBER_OUTSIDE_VALID_RANGE"),
    ("Weight__c", "0.0001", "NUMBER_OUTSIDE_VALID_RANGE"),
    ("Code__c", "null", "REQUIRED_FIELD_MISSING"),
    ("Title__c", '"sixsix"', "STRING_TOO_LONG"),
])
def test_values_outside_a_fields_limits_fail_only_their_record(http: httpx.Client, state: NexusCrmState,
                                                               field: str, value: str, code: str) -> None:
    good = f'{{"attributes": {{"type": "{OBJECT}"}}, "{KEY}": "A", "Code__c": "c"}}'
    bad = f'{{"attributes": {{"type": "{OBJECT}"}}, "{KEY}": "B", "Code__c": "c", "{field}": {value}}}'
    items = upsert_raw(http, token(http), f"{good}, {bad}").json()
    assert items[0]["success"] and items[1]["errors"][0]["statusCode"] == code
    assert items[1]["errors"][0]["fields"] == [field]
    assert [r[KEY] for r in state.records(OBJECT)] == ["A"]


def test_a_required_field_missing_on_create_fails_that_record(http: httpx.Client, state: NexusCrmState) -> None:
    body = {"allOrNone": False, "records": [{"attributes": {"type": OBJECT}, KEY: "A"}]}
    (item,) = http.patch(UPSERT_PATH, json=body, headers={"Authorization": f"Bearer {token(http)}"}).json()
    assert item["errors"][0]["statusCode"] == "REQUIRED_FIELD_MISSING" and item["errors"][0]["fields"] == ["Code__c"]
    assert upsert(http, token(http), [{KEY: "A"}]).json()[0]["success"]
    # an update need not repeat it
    body["records"][0]["Title__c"] = "x"
    (update,) = http.patch(UPSERT_PATH, json=body, headers={"Authorization": f"Bearer {token(http)}"}).json()
    assert update["success"] and state.get_record(OBJECT, KEY, "A")["Code__c"] == "c"


def test_all_or_none_rolls_back_every_record_when_one_fails(http: httpx.Client, state: NexusCrmState) -> None:
    tok = token(http)
    assert upsert(http, tok, [{KEY: "A", "Title__c": "old"}]).json()[0]["success"]
    items = upsert(http, tok, [{KEY: "A", "Title__c": "new"}, {KEY: "B"}, {KEY: "C", "Title__c": "toolong"}],
                   all_or_none=True).json()
    assert [i["success"] for i in items] == [False, False, False]
    assert [i["errors"][0]["statusCode"] for i in items] == [
        "ALL_OR_NONE_OPERATION_ROLLED_BACK", "ALL_OR_NONE_OPERATION_ROLLED_BACK", "STRING_TOO_LONG"]
    assert [r["Title__c"] for r in state.records(OBJECT)] == ["old"]  # the update was rolled back too
    assert state.get_record(OBJECT, KEY, "B") is None
    ok = upsert(http, tok, [{KEY: "A", "Title__c": "new"}, {KEY: "B"}], all_or_none=True).json()
    assert [i["success"] for i in ok] == [True, True] and [i["created"] for i in ok] == [False, True]


def test_the_daily_api_allocation_is_enforced_on_every_endpoint(http: httpx.Client, state: NexusCrmState) -> None:
    state.api_limit = 3
    tok = token(http)
    describe = f"/services/data/v63.0/sobjects/{OBJECT}/describe"
    auth = {"Authorization": f"Bearer {tok}"}
    assert http.get(describe, headers=auth).headers["Sforce-Limit-Info"] == "api-usage=1/3"
    assert upsert(http, tok, [{KEY: "A"}]).headers["Sforce-Limit-Info"] == "api-usage=2/3"
    assert http.get(describe, headers=auth).status_code == 200
    for response in (http.get(describe, headers=auth), upsert(http, tok, [{KEY: "B"}]),
                     http.post("/services/oauth2/token", data={"grant_type": "client_credentials",
                                                                "client_id": "cid", "client_secret": "csecret"})):
        assert response.status_code == 403
        assert response.json()[0]["errorCode"] == "REQUEST_LIMIT_EXCEEDED"
        assert response.headers["Sforce-Limit-Info"] == "api-usage=3/3"
    assert state.get_record(OBJECT, KEY, "B") is None
    state.set_api_usage(1)  # calls older than 24 hours age out of the allocation
    assert upsert(http, tok, [{KEY: "B"}]).headers["Sforce-Limit-Info"] == "api-usage=2/3"


def test_reorder_fault_applies_the_writes_and_moves_every_result(http: httpx.Client, state: NexusCrmState) -> None:
    tok = token(http)
    state.faults.push(Fault.reorder_results())
    items = upsert(http, tok, [{KEY: "A"}, {KEY: "B"}, {KEY: "C", "Title__c": "toolong"}]).json()
    ids = {r[KEY]: r["Id"] for r in state.records(OBJECT)}
    assert set(ids) == {"A", "B"}
    assert [i.get("id") for i in items] != [ids.get("A"), ids.get("B"), None]  # no result in its own slot
    assert sorted(i.get("id") or "" for i in items) == sorted([ids["A"], ids["B"], ""])


def test_alter_result_fault_applies_the_writes_and_garbles_only_that_answer(http: httpx.Client,
                                                                           state: NexusCrmState) -> None:
    state.faults.push(Fault.alter_result("B", id="a0Z\x00not-an-id"))
    items = upsert(http, token(http), [{KEY: "A"}, {KEY: "B"}]).json()
    ids = {r[KEY]: r["Id"] for r in state.records(OBJECT)}
    assert items[0]["id"] == ids["A"] and items[1]["id"] == "a0Z\x00not-an-id" != ids["B"]
    assert items[1]["success"] is True and items[1]["created"] is True


def test_reject_request_fault_answers_for_the_whole_request_and_writes_nothing(http: httpx.Client,
                                                                                state: NexusCrmState) -> None:
    state.faults.push(Fault.reject_request("JSON_PARSER_ERROR", "Unexpected character"))
    response = upsert(http, token(http), [{KEY: "A"}])
    assert response.status_code == 400 and response.json()[0]["errorCode"] == "JSON_PARSER_ERROR"
    assert state.records(OBJECT) == []


def test_an_object_built_from_a_field_contract_describes_it(http: httpx.Client) -> None:
    contract = (FieldContract("Key__c", "string", length=20, nillable=False, external_id=True),
                FieldContract("Amount__c", "currency", precision=16, scale=2),
                FieldContract("On__c", "date"))
    state = NexusCrmState(client_id="cid", client_secret="csecret")
    state.define_object_from_contract("Thing__c", contract, extra_fields=[FieldSpec("Notes__c", length=255)])
    with httpx.Client(transport=SimulatorTransport(state), base_url=BASE) as client:
        fields = {f["name"]: f for f in client.get("/services/data/v63.0/sobjects/Thing__c/describe",
                                                   headers={"Authorization": f"Bearer {token(client)}"}).json()["fields"]}
    assert fields["Key__c"]["externalId"] and fields["Key__c"]["unique"] and not fields["Key__c"]["nillable"]
    assert (fields["Amount__c"]["precision"], fields["Amount__c"]["scale"], fields["Amount__c"]["length"]) == (16, 2, 0)
    assert fields["On__c"]["type"] == "date" and "Notes__c" in fields


def test_a_checkbox_is_described_as_never_nillable(http: httpx.Client, state: NexusCrmState) -> None:
    fields = {f["name"]: f for f in http.get(f"/services/data/v63.0/sobjects/{OBJECT}/describe",
                                             headers={"Authorization": f"Bearer {token(http)}"}).json()["fields"]}
    assert (fields["Paid__c"]["nillable"], fields["Paid__c"]["defaultedOnCreate"]) == (False, True)
    with pytest.raises(ValueError, match="Paid__c: a boolean .checkbox. field is never nillable in Salesforce"):
        FieldSpec("Paid__c", type="boolean")
    with pytest.raises(ValueError, match="never nillable"):
        state.alter_field(OBJECT, "Paid__c", nillable=True)  # no admin can make it so


def test_faults_are_fifo_and_consumed_only_by_upserts(http: httpx.Client, state: NexusCrmState) -> None:
    tok = token(http)
    state.faults.push(Fault.status(429, retry_after=3), Fault.status(503))
    http.get(f"/services/data/v63.0/sobjects/{OBJECT}/describe", headers={"Authorization": f"Bearer {tok}"})
    first = upsert(http, tok, [{KEY: "A"}])
    assert (first.status_code, first.headers["Retry-After"]) == (429, "3")
    assert first.json()[0]["errorCode"] != "REQUEST_LIMIT_EXCEEDED"  # Salesforce reports its limits with 403
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
            client.preflight(OBJECT, [FieldContract(KEY, "string", length=32, nillable=False, external_id=True),
                                      FieldContract("Title__c", "string", length=5)])
            first = client.upsert_batch(OBJECT, KEY, [{KEY: "A", "Title__c": "one", "Code__c": "c"},
                                                      {KEY: "B", "Title__c": "toolong", "Code__c": "c"}])
            assert [r.success for r in first.results] == [True, False] and first.created_external_ids == {"A"}
            assert first.limit_info is not None and first.limit_info.used == 2
            state.faults.push(Fault.timeout_after_apply(hang_s=0.4))
            lost = client.upsert_batch(OBJECT, KEY, [{KEY: "C", "Code__c": "c"}])
            assert (lost.results[0].error_code, lost.results[0].retryable) == ("TIMEOUT", True)
            assert state.get_record(OBJECT, KEY, "C") is not None
            replay = client.upsert_batch(OBJECT, KEY, [{KEY: "C", "Code__c": "c"}])
            assert replay.results[0].success and replay.created_external_ids == frozenset()
    finally:
        stop()
    assert state.calls() == {"token": 1, "describe": 1, "upsert": 3}


def query(http: httpx.Client, tok: str, soql: str) -> httpx.Response:
    return http.get("/services/data/v63.0/query", params={"q": soql}, headers={"Authorization": f"Bearer {tok}"})


def test_soql_query_reads_records_back_by_external_id(http: httpx.Client, state: NexusCrmState) -> None:
    tok = token(http)
    upsert(http, tok, [{KEY: "A"}, {KEY: "it's"}, {KEY: "back\\slash"}])
    ids = {r[KEY]: r["Id"] for r in state.records(OBJECT)}
    response = query(http, tok, f"SELECT Id, {KEY} FROM {OBJECT} WHERE {KEY} IN ('A', 'it\\'s', 'back\\\\slash', 'Z')")
    assert response.status_code == 200 and response.headers["Sforce-Limit-Info"] == "api-usage=2/15000"
    page = response.json()
    assert (page["totalSize"], page["done"]) == (3, True) and "nextRecordsUrl" not in page
    assert {r[KEY]: r["Id"] for r in page["records"]} == ids
    assert page["records"][0]["attributes"] == {"type": OBJECT,
                                                "url": f"/services/data/v63.0/sobjects/{OBJECT}/{ids['A']}"}
    assert state.calls()["query"] == 1


def test_soql_query_refuses_what_salesforce_refuses(http: httpx.Client) -> None:
    tok = token(http)
    for soql, status, code in (
            (f"SELECT Id FROM {OBJECT} WHERE {KEY} = 'A'", 400, "MALFORMED_QUERY"),
            (f"SELECT Id FROM {OBJECT} WHERE {KEY} IN ('A',)", 400, "MALFORMED_QUERY"),
            (f"SELECT Id FROM {OBJECT} WHERE {KEY} IN ('\\x')", 400, "MALFORMED_QUERY"),
            (f"SELECT Id FROM Nope__c WHERE {KEY} IN ('A')", 400, "INVALID_TYPE"),
            (f"SELECT Id, Nope__c FROM {OBJECT} WHERE {KEY} IN ('A')", 400, "INVALID_FIELD")):
        response = query(http, tok, soql)
        assert (response.status_code, response.json()[0]["errorCode"]) == (status, code), soql
    long = query(http, tok, f"SELECT Id FROM {OBJECT} WHERE {KEY} IN ({','.join(['%r' % ('x' * 30)] * 600)})")
    assert long.status_code == 414  # URI and headers are limited to 16,384 bytes
    assert http.get("/services/data/v63.0/query", params={"q": f"SELECT Id FROM {OBJECT} WHERE {KEY} IN ('A')"}
                    ).status_code == 401


def test_soql_query_pages_2000_records_at_a_time_and_the_client_follows(http: httpx.Client,
                                                                        state: NexusCrmState) -> None:
    tok = token(http)
    for start in range(0, 2100, 200):  # every record has Code__c = 'c'
        assert upsert(http, tok, [{KEY: f"k{i}"} for i in range(start, start + 200)]).status_code == 200
    first = query(http, tok, f"SELECT Id, {KEY} FROM {OBJECT} WHERE Code__c IN ('c')").json()
    assert (first["totalSize"], first["done"], len(first["records"])) == (2200, False, 2000)
    more = http.get(first["nextRecordsUrl"], headers={"Authorization": f"Bearer {tok}"}).json()
    assert (more["done"], len(more["records"])) == (True, 200)
    assert {r[KEY] for r in first["records"] + more["records"]} == {f"k{i}" for i in range(2200)}
    bad = http.get(first["nextRecordsUrl"][:-4] + "4001", headers={"Authorization": f"Bearer {tok}"})
    assert (bad.status_code, bad.json()[0]["errorCode"]) == (400, "INVALID_QUERY_LOCATOR")

    client = NexusCrmClient(NexusCrmCredentials(base_url=BASE, client_id="cid", client_secret="csecret"),
                            transport=SimulatorTransport(state))
    before = state.calls()["query"]
    found, calls = client.ids_by_external_id(OBJECT, KEY, [f"k{i}" for i in range(2200)])
    assert found == {r[KEY]: r["Id"] for r in state.records(OBJECT)}
    assert calls == state.calls()["query"] - before > 1  # each query's URI kept short, none refused
    _, paged = client.ids_by_external_id(OBJECT, "Code__c", ["c"])
    assert paged == 2  # the second page read through nextRecordsUrl
