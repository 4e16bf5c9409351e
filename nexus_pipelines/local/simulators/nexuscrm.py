"""A stateful NexusCRM simulator: the parts of the Salesforce-compatible REST API v63 the
writeback uses (OAuth client_credentials, describe, sObject Collections upsert, SOQL query by external id), at least as
strict as Salesforce documents them:

- every field value is type-checked (`nexuscrm_fields`): a value of the wrong type or
  format, or an unknown field, fails the whole request with 400; a value outside the
  field's limits fails its record;
- `allOrNone: true` rolls back every record when one fails (ALL_OR_NONE_OPERATION_ROLLED_BACK);
- the org's daily API allocation (`api_limit`) is enforced: once spent, every endpoint,
  the token endpoint included, answers 403 REQUEST_LIMIT_EXCEEDED; every data response
  carries `Sforce-Limit-Info: api-usage=N/M`;
- results come back in request order unless a fault reorders or reverses them;
- SOQL `GET /query` answers the one shape the writeback sends (`nexuscrm_query`): records
  by external id, 2,000 per page; a URI beyond 16,384 bytes answers 414.

The request handling is one plain function, `handle(state, request)`, over `NexusCrmState`.
Two thin adapters expose it:

- `build_nexuscrm_app(state)`: a Starlette ASGI app, served over real HTTP with
  `nexus_pipelines.local.simulators.http.serve_in_thread` (local stack, benchmarks);
- `SimulatorTransport(state)`: a sync `httpx.BaseTransport` for tests, with no network.
  (httpx's ASGITransport is async-only, so it cannot back the sync client.)

Faults are queued with `state.faults.push(...)` and consumed one per upsert call.
Objects are built from a job's field contract (`define_object_from_contract`) and can be
altered later (`alter_field`), as a CRM admin would, to show contract drift.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from enum import Enum
from functools import partial
from typing import Any
from urllib.parse import parse_qs

import anyio
import httpx
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


from nexus_pipelines.integrations.nexuscrm import FieldContract
from nexus_pipelines.local.simulators.nexuscrm_query import QUERY_PAGE_SIZE, MalformedQuery, parse_in_query
from nexus_pipelines.local.simulators.nexuscrm_fields import FieldSpec, RequestRejected, check_value, record_error

API_VERSION = "v63.0"
MAX_RECORDS = 200
SERVER_MANAGED_FIELDS = ("Id", "CreatedDate", "LastModifiedDate")
_ID_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
ROLLED_BACK = ("ALL_OR_NONE_OPERATION_ROLLED_BACK",
               "Record rolled back because not all records were valid and the request was using AllOrNone header")

ValidationRule = Callable[[Mapping[str, Any]], str | None]


def rejects_negative(field_name: str) -> ValidationRule:
    """A validation rule of the org: `field_name` must not be negative."""

    def rule(record: Mapping[str, Any]) -> str | None:
        value = record.get(field_name)
        return f"{field_name} must not be negative" if value is not None and Decimal(value) < 0 else None

    return rule


class FaultKind(Enum):
    STATUS = "status"
    EXPIRE_TOKEN = "expire_token"
    LOCK_ROWS = "lock_rows"
    MALFORMED_JSON = "malformed_json"
    DROP_RESULT = "drop_result"
    FAIL_AFTER_APPLY = "fail_after_apply"
    TIMEOUT_AFTER_APPLY = "timeout_after_apply"
    REORDER_RESULTS = "reorder_results"
    REVERSE_RESULTS = "reverse_results"
    ALTER_RESULT = "alter_result"
    REJECT_REQUEST = "reject_request"


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    status_code: int = 500
    retry_after: str | None = None
    external_ids: frozenset[str] = frozenset()
    keep_position: bool = True
    hang_s: float = 0.0
    error_code: str = ""
    message: str = ""
    result_changes: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def status(cls, status_code: int, retry_after: int | str | None = None) -> Fault:
        """Answer with this status and write nothing; `retry_after` is seconds or an HTTP date."""
        header = None if retry_after is None else str(retry_after)
        return cls(FaultKind.STATUS, status_code=status_code, retry_after=header)

    @classmethod
    def expire_token(cls) -> Fault:
        """Expire every issued token first, so this call gets 401 INVALID_SESSION_ID."""
        return cls(FaultKind.EXPIRE_TOKEN)

    @classmethod
    def lock_rows(cls, *external_ids: str) -> Fault:
        """These records fail with UNABLE_TO_LOCK_ROW; the others are written."""
        return cls(FaultKind.LOCK_ROWS, external_ids=frozenset(external_ids))

    @classmethod
    def malformed_json(cls) -> Fault:
        """Apply the writes, then answer 200 with a truncated JSON body."""
        return cls(FaultKind.MALFORMED_JSON)

    @classmethod
    def drop_result(cls, external_id: str, *, keep_position: bool = True) -> Fault:
        """Apply the writes, then leave this record's result out: as `null` in its slot, or
        removed from the list (a shorter list) when keep_position is False."""
        return cls(FaultKind.DROP_RESULT, external_ids=frozenset({external_id}), keep_position=keep_position)

    @classmethod
    def fail_after_apply(cls, status_code: int = 500) -> Fault:
        return cls(FaultKind.FAIL_AFTER_APPLY, status_code=status_code)

    @classmethod
    def reorder_results(cls) -> Fault:
        """Apply the writes, then answer with every result moved one slot on (a broken
        gateway or CRM; Salesforce documents results in request order)."""
        return cls(FaultKind.REORDER_RESULTS)

    @classmethod
    def reverse_results(cls) -> Fault:
        """Apply the writes, then answer with the results in reverse request order."""
        return cls(FaultKind.REVERSE_RESULTS)

    @classmethod
    def alter_result(cls, external_id: str, **changes: Any) -> Fault:
        """Apply the writes, then answer this record's result with `changes` merged in (a CRM or
        a gateway that garbles an answer, for example an `id` of the wrong shape)."""
        return cls(FaultKind.ALTER_RESULT, external_ids=frozenset({external_id}), result_changes=dict(changes))

    @classmethod
    def reject_request(cls, error_code: str, message: str, status_code: int = 400) -> Fault:
        """Refuse the whole request (for example JSON_PARSER_ERROR) and write nothing."""
        return cls(FaultKind.REJECT_REQUEST, status_code=status_code, error_code=error_code, message=message)

    @classmethod
    def timeout_after_apply(cls, hang_s: float = 2.0) -> Fault:
        """Apply the writes, then never answer in time: over HTTP the server waits `hang_s`
        (set it above the client's read timeout); in process the transport raises ReadTimeout."""
        return cls(FaultKind.TIMEOUT_AFTER_APPLY, hang_s=hang_s)


class FaultQueue:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[Fault] = deque()

    def push(self, *faults: Fault) -> None:
        with self._lock:
            self._queue.extend(faults)

    def pop(self) -> Fault | None:
        with self._lock:
            return self._queue.popleft() if self._queue else None

    def pop_if(self, kind: FaultKind) -> Fault | None:
        with self._lock:
            return self._queue.popleft() if self._queue and self._queue[0].kind is kind else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._queue)


@dataclass(frozen=True)
class RequestLogEntry:
    method: str
    path: str
    record_count: int | None


@dataclass
class _Object:
    name: str
    fields: dict[str, FieldSpec]
    key_prefix: str
    rules: list[ValidationRule] = field(default_factory=list)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)  # by Id
    index: dict[str, dict[str, set[str]]] = field(default_factory=dict)  # indexed field -> value -> Ids

    def find(self, field_name: str, value: Any) -> list[str]:
        if field_name in self.index:
            return sorted(self.index[field_name].get(str(value), ()))
        return [rid for rid, rec in self.records.items() if rec.get(field_name) == value]

    def store(self, record_id: str, record: dict[str, Any] | None) -> None:
        """Write (or, with None, delete) one record and keep the indexes in step."""
        old = self.records.get(record_id, {})
        for name, values in self.index.items():
            if old.get(name) is not None:
                values[str(old[name])].discard(record_id)
            if record is not None and record.get(name) is not None:
                values.setdefault(str(record[name]), set()).add(record_id)
        if record is None:
            self.records.pop(record_id, None)
        else:
            self.records[record_id] = record


class NexusCrmState:
    """Objects, records, tokens, faults and counters of one simulated org. Thread-safe."""

    def __init__(
        self,
        *,
        client_id: str = "sim-client-id",
        client_secret: str = "sim-client-secret",
        token_ttl_s: float = 3600.0,
        latency_s: float = 0.0,
        api_limit: int = 15000,
    ) -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.token_ttl_s = token_ttl_s
        self.latency_s = latency_s  # added to every call, for benchmarks
        self.api_limit = api_limit  # the org's daily allocation of API calls
        self.faults = FaultQueue()
        self._lock = threading.RLock()
        self._objects: dict[str, _Object] = {}
        self._tokens: dict[str, float] = {}  # token -> monotonic expiry
        self._calls: Counter[str] = Counter()
        self._log: list[RequestLogEntry] = []
        self._api_used = 0
        self._cursors: dict[str, list[dict[str, Any]]] = {}  # query locator -> every row of its query
        self._last_id = 0
        # Record ids are unique across orgs, as in Salesforce: a second simulated org (or a
        # refreshed sandbox) never hands out an id the first one did.
        self._org_mark = "".join(secrets.choice(_ID_CHARS) for _ in range(3))

    # -- setup by the caller ----------------------------------------------------------

    def define_object(self, name: str, fields: Iterable[FieldSpec], *, key_prefix: str = "a0X") -> None:
        """Register a custom object; Id, CreatedDate and LastModifiedDate are added as
        server-managed fields."""
        managed = {"createable": False, "updateable": False, "nillable": False}
        specs = {
            "Id": FieldSpec("Id", type="id", id_lookup=True, length=18, **managed),            "CreatedDate": FieldSpec("CreatedDate", type="datetime", **managed),
            "LastModifiedDate": FieldSpec("LastModifiedDate", type="datetime", **managed),
        }
        specs.update({spec.name: spec for spec in fields})
        indexed = [n for n, s in specs.items() if n != "Id" and (s.unique or s.external_id)]
        with self._lock:
            self._objects[name] = _Object(name, specs, key_prefix, index={n: {} for n in indexed})

    def define_object_from_contract(self, name: str, contract: Iterable[FieldContract], *,
                                    extra_fields: Iterable[FieldSpec] = (), key_prefix: str = "a0X") -> None:
        """Deploy the object a job declares (its mapper's field contract), plus fields the
        CRM's own users own."""
        self.define_object(name, [*(FieldSpec.from_contract(c) for c in contract), *extra_fields],
                           key_prefix=key_prefix)

    def alter_field(self, object_name: str, field_name: str, **changes: Any) -> None:
        """Change a deployed field (type, length, precision, nillable, ...), as a CRM admin
        would; with `drop=True` the field is deleted."""
        with self._lock:
            obj = self._objects[object_name]
            if changes.pop("drop", False):
                del obj.fields[field_name]
            else:
                obj.fields[field_name] = replace(obj.fields[field_name], **changes)

    def add_validation_rule(self, object_name: str, rule: ValidationRule) -> None:
        """`rule(record_after_write)` returns an error message to reject the record."""
        with self._lock:
            self._objects[object_name].rules.append(rule)

    def set_api_usage(self, used: int) -> None:
        """API calls counted against today's allocation (other integrations share it;
        calls older than 24 hours age out)."""
        with self._lock:
            self._api_used = used

    def expire_tokens(self) -> None:
        with self._lock:
            self._tokens = dict.fromkeys(self._tokens, 0.0)

    # -- inspection by tests ----------------------------------------------------------

    def records(self, object_name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(r) for r in self._objects[object_name].records.values()]

    def get_record(self, object_name: str, field_name: str, value: Any) -> dict[str, Any] | None:
        with self._lock:
            obj = self._objects[object_name]
            ids = obj.find(field_name, value)
            return dict(obj.records[ids[0]]) if ids else None

    def calls(self) -> dict[str, int]:
        """Requests per endpoint: token, describe, upsert, query, unknown."""
        with self._lock:
            return dict(self._calls)

    def request_log(self) -> list[RequestLogEntry]:
        with self._lock:
            return list(self._log)

    # -- used by the handler ----------------------------------------------------------

    def _note_request(self, endpoint: str, entry: RequestLogEntry) -> None:
        with self._lock:
            self._calls[endpoint] += 1
            self._log.append(entry)

    def _issue_token(self) -> str:
        token = "00Dsim!" + secrets.token_urlsafe(24)
        with self._lock:
            self._tokens[token] = time.monotonic() + self.token_ttl_s
        return token

    def _token_valid(self, authorization: str | None) -> bool:
        scheme, _, token = (authorization or "").partition(" ")
        with self._lock:
            return scheme.lower() == "bearer" and self._tokens.get(token, 0.0) > time.monotonic()

    def _use_api_call(self) -> tuple[bool, str]:
        """Count one call against the allocation: (allowed, the Sforce-Limit-Info value)."""
        with self._lock:
            allowed = self._api_used < self.api_limit
            self._api_used += allowed
            return allowed, f"api-usage={self._api_used}/{self.api_limit}"

    def _allocation_spent(self) -> str | None:
        with self._lock:
            spent = self._api_used >= self.api_limit
            return f"api-usage={self._api_used}/{self.api_limit}" if spent else None

    def _new_id(self, obj: _Object) -> str:
        self._last_id += 1
        return f"{obj.key_prefix}{self._org_mark}{self._last_id:012d}"


@dataclass(frozen=True)
class SimRequest:
    method: str
    path: str
    authorization: str | None
    body: bytes
    base_url: str  # scheme://host[:port] the client called; returned as instance_url
    query: str = ""  # the URL's raw query string


@dataclass(frozen=True)
class SimResponse:
    status: int
    body: bytes
    headers: dict[str, str]
    hang_s: float | None = None  # the write was applied and the caller must see a timeout


_DESCRIBE = re.compile(r"^/services/data/(?P<version>v[\d.]+)/sobjects/(?P<object>\w+)/describe/?$")
_QUERY = re.compile(r"^/services/data/(?P<version>v[\d.]+)/query/?$")
_QUERY_MORE = re.compile(r"^/services/data/(?P<version>v[\d.]+)/query/(?P<locator>[0-9a-f]+)-(?P<offset>\d+)$")
MAX_URI_BYTES = 16384  # Salesforce answers 414 URI Too Long beyond it
_UPSERT = re.compile(r"^/services/data/(?P<version>v[\d.]+)/composite/sobjects/(?P<object>\w+)/(?P<field>\w+)/?$")
_STATUS_ERRORS = {
    401: ("INVALID_SESSION_ID", "Session expired or invalid"),
    403: ("REQUEST_LIMIT_EXCEEDED", "TotalRequests Limit exceeded."),
    429: ("TOO_MANY_REQUESTS", "Too many requests (a gateway in front of the org)"),
    503: ("SERVER_UNAVAILABLE", "Server temporarily unavailable"),
}


def _json(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> SimResponse:
    return SimResponse(status, json.dumps(payload).encode(), {"content-type": "application/json", **(headers or {})})


def _error(status: int, code: str, message: str, headers: Mapping[str, str] | None = None) -> SimResponse:
    return _json(status, [{"errorCode": code, "message": message}], headers)


def _status_error(status: int, headers: Mapping[str, str] | None = None) -> SimResponse:
    code, message = _STATUS_ERRORS.get(status, ("UNKNOWN_EXCEPTION", "An unexpected error occurred"))
    return _error(status, code, message, headers)


def _record_count(body: bytes) -> int | None:
    try:
        records = json.loads(body).get("records")
    except (ValueError, AttributeError):
        return None
    return len(records) if isinstance(records, list) else None


def handle(state: NexusCrmState, request: SimRequest) -> SimResponse:
    """Route one request; the only request-handling logic, shared by both adapters."""
    if state.latency_s:
        time.sleep(state.latency_s)
    describe, upsert = _DESCRIBE.match(request.path), _UPSERT.match(request.path)
    query, more = _QUERY.match(request.path), _QUERY_MORE.match(request.path)
    if len(request.path.encode()) + len(request.query.encode()) + 1 > MAX_URI_BYTES:
        state._note_request("unknown", RequestLogEntry(request.method, request.path, None))
        return _json(414, [{"errorCode": "URI_TOO_LONG", "message": "URI Too Long"}])
    if request.path == "/services/oauth2/token" and request.method == "POST":
        state._note_request("token", RequestLogEntry(request.method, request.path, None))
        return _token(state, request)
    if describe and request.method == "GET":
        state._note_request("describe", RequestLogEntry(request.method, request.path, None))
        return _data_call(state, request, describe["version"], partial(_describe, state, describe["object"]))
    if upsert and request.method == "PATCH":
        state._note_request("upsert", RequestLogEntry(request.method, request.path, _record_count(request.body)))
        if state.faults.pop_if(FaultKind.EXPIRE_TOKEN):
            state.expire_tokens()
        run = partial(_upsert, state, upsert["object"], upsert["field"], request.body)
        return _data_call(state, request, upsert["version"], run)
    if (query or more) and request.method == "GET":
        state._note_request("query", RequestLogEntry(request.method, request.path, None))
        version = (query or more)["version"]
        run = partial(_query, state, version, request.query) if query else partial(
            _query_more, state, version, more["locator"], int(more["offset"]))
        return _data_call(state, request, version, run)
    state._note_request("unknown", RequestLogEntry(request.method, request.path, None))
    return _error(404, "NOT_FOUND", "The requested resource does not exist")


def _token(state: NexusCrmState, request: SimRequest) -> SimResponse:
    spent = state._allocation_spent()
    if spent:
        return _status_error(403, {"sforce-limit-info": spent})
    form = {k: v[0] for k, v in parse_qs(request.body.decode("utf-8", "replace")).items()}
    if form.get("grant_type") != "client_credentials":
        return _json(400, {"error": "unsupported_grant_type", "error_description": "grant type not supported"})
    pairs = ((form.get("client_id", ""), state.client_id), (form.get("client_secret", ""), state.client_secret))
    if not all(secrets.compare_digest(given.encode(), wanted.encode()) for given, wanted in pairs):
        return _json(400, {"error": "invalid_client", "error_description": "invalid client credentials"})
    return _json(
        200,
        {
            "access_token": state._issue_token(),
            "instance_url": request.base_url,
            "id": f"{request.base_url}/id/00Dsim/005sim",
            "token_type": "Bearer",
            "issued_at": str(int(time.time() * 1000)),
            "signature": secrets.token_urlsafe(16),
            "scope": "api",
        },
    )


def _data_call(state: NexusCrmState, request: SimRequest, version: str, run: Callable[[], SimResponse]) -> SimResponse:
    if version != API_VERSION:
        return _error(404, "NOT_FOUND", f"API version {version} is not simulated")
    if not state._token_valid(request.authorization):
        return _status_error(401)
    allowed, usage = state._use_api_call()
    limit_header = {"sforce-limit-info": usage}
    if not allowed:
        return _status_error(403, limit_header)
    response = run()
    return SimResponse(response.status, response.body, {**response.headers, **limit_header}, response.hang_s)


def _describe(state: NexusCrmState, object_name: str) -> SimResponse:
    with state._lock:
        obj = state._objects.get(object_name)
        if obj is None:
            return _error(404, "NOT_FOUND", "The requested resource does not exist")
        fields = [spec.describe() for spec in obj.fields.values()]
    return _json(200, {"name": obj.name, "label": obj.name, "custom": True, "createable": True, "fields": fields})


def _query(state: NexusCrmState, version: str, raw_query: str) -> SimResponse:
    soql = parse_qs(raw_query, keep_blank_values=True).get("q", [""])[0]
    try:
        query = parse_in_query(soql)
    except MalformedQuery as exc:
        return _error(400, "MALFORMED_QUERY", str(exc))
    with state._lock:
        obj = state._objects.get(query.object_name)
        if obj is None:
            return _error(400, "INVALID_TYPE", f"sObject type '{query.object_name}' is not supported.")
        for name in (*query.fields, query.key):
            if name not in obj.fields:
                return _error(400, "INVALID_FIELD", f"No such column '{name}' on entity '{obj.name}'.")
        ids = [rid for value in dict.fromkeys(query.values) for rid in obj.find(query.key, value)]
        rows = [{"attributes": {"type": obj.name, "url": f"/services/data/{version}/sobjects/{obj.name}/{rid}"},
                 **{name: obj.records[rid].get(name) for name in query.fields}} for rid in ids]
        locator = secrets.token_hex(8)
        if len(rows) > QUERY_PAGE_SIZE:
            state._cursors[locator] = rows
    return _query_page(version, rows, locator, 0)


def _query_more(state: NexusCrmState, version: str, locator: str, offset: int) -> SimResponse:
    with state._lock:
        rows = state._cursors.get(locator)
    if rows is None or offset % QUERY_PAGE_SIZE or offset >= len(rows):
        return _error(400, "INVALID_QUERY_LOCATOR", "invalid query locator")
    return _query_page(version, rows, locator, offset)


def _query_page(version: str, rows: list[dict[str, Any]], locator: str, offset: int) -> SimResponse:
    end = offset + QUERY_PAGE_SIZE
    page: dict[str, Any] = {"totalSize": len(rows), "done": end >= len(rows), "records": rows[offset:end]}
    if not page["done"]:
        page["nextRecordsUrl"] = f"/services/data/{version}/query/{locator}-{end}"
    return _json(200, page)


def _reject_number_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_upsert_body(body: bytes) -> tuple[bool, list[Any]]:
    """allOrNone and the records of a well-formed body; raises RequestRejected."""
    try:
        payload = json.loads(body, parse_float=Decimal, parse_constant=_reject_number_constant)
    except ValueError:
        raise RequestRejected("JSON_PARSER_ERROR", "The request body is not valid JSON") from None
    records = payload.get("records") if isinstance(payload, dict) else None
    all_or_none = payload.get("allOrNone", False) if isinstance(payload, dict) else None
    if not isinstance(records, list) or not isinstance(all_or_none, bool) or set(payload) - {"allOrNone", "records"}:
        raise RequestRejected("JSON_PARSER_ERROR", "Body must be {\"allOrNone\": <boolean>, \"records\": [...]}")
    if len(records) > MAX_RECORDS:
        message = f"record limit reached. cannot submit more than {MAX_RECORDS} records into this call"
        raise RequestRejected("EXCEEDED_ID_LIMIT", message)
    return all_or_none, records


def _check_request(obj: _Object, external_id_field: str, records: list[Any]) -> None:
    """Everything Salesforce refuses for the whole request before writing any record."""
    key_spec = obj.fields.get(external_id_field)
    if key_spec is None or not key_spec.external_id:
        message = f"Provided external ID field does not exist or is not accessible: {external_id_field}"
        raise RequestRejected("INVALID_FIELD", message)
    for raw in records:
        if not isinstance(raw, dict):
            raise RequestRejected("JSON_PARSER_ERROR", "Each record must be a JSON object")
        for name, value in raw.items():
            if name == "attributes":
                continue
            spec = obj.fields.get(name)
            if spec is None:
                raise RequestRejected("INVALID_FIELD", f"No such column '{name}' on sobject of type {obj.name}")
            check_value(spec, value)


def _upsert(state: NexusCrmState, object_name: str, external_id_field: str, body: bytes) -> SimResponse:
    fault = state.faults.pop()
    if fault and fault.kind is FaultKind.STATUS:
        headers = {"retry-after": fault.retry_after} if fault.retry_after is not None else None
        return _status_error(fault.status_code, headers)
    if fault and fault.kind is FaultKind.REJECT_REQUEST:
        return _error(fault.status_code, fault.error_code, fault.message)
    locked = fault.external_ids if fault and fault.kind is FaultKind.LOCK_ROWS else frozenset()
    try:
        all_or_none, records = _parse_upsert_body(body)
        with state._lock:
            obj = state._objects.get(object_name)
            if obj is None:
                return _error(404, "NOT_FOUND", "The requested resource does not exist")
            _check_request(obj, external_id_field, records)
            results = _apply(state, obj, external_id_field, records, locked, all_or_none)
    except RequestRejected as rejected:
        return _error(400, rejected.code, rejected.message)
    return _after_apply(fault, results, external_id_field, records)


def _apply(state: NexusCrmState, obj: _Object, key_field: str, records: list[dict], locked: frozenset[str],
           all_or_none: bool) -> list[dict[str, Any]]:
    """Write the records in order; with allOrNone, undo them all when one fails. The
    caller holds the state lock, which is what makes the external ID unique under
    concurrent upserts."""
    keys = Counter(str(r.get(key_field)) for r in records)
    undo: list[tuple[str, dict[str, Any] | None]] = []
    results = [_upsert_one(state, obj, key_field, raw, locked, keys, undo) for raw in records]
    if not all_or_none or all(r["success"] for r in results):
        return results
    for record_id, old in reversed(undo):
        obj.store(record_id, old)
    return [r if not r["success"] else _record_error(*ROLLED_BACK) for r in results]


def _after_apply(fault: Fault | None, results: list[Any], key_field: str, records: list[Any]) -> SimResponse:
    kind = fault.kind if fault else None
    if kind is FaultKind.MALFORMED_JSON:
        # Without its closing bracket the list is never valid JSON.
        return SimResponse(200, _dumps(results)[:-1], {"content-type": "application/json"})
    if kind is FaultKind.FAIL_AFTER_APPLY:
        return _status_error(fault.status_code)
    if kind is FaultKind.TIMEOUT_AFTER_APPLY:
        return SimResponse(504, b"", {}, hang_s=fault.hang_s)
    if kind is FaultKind.REORDER_RESULTS:
        results = results[-1:] + results[:-1]
    if kind is FaultKind.REVERSE_RESULTS:
        results = results[::-1]
    keys = [str(r.get(key_field)) if isinstance(r, dict) else None for r in records]
    chosen = [i for i, key in enumerate(keys) if fault and key in fault.external_ids]
    if kind is FaultKind.ALTER_RESULT:
        for i in chosen:
            results[i] = {**results[i], **fault.result_changes}
    if kind is FaultKind.DROP_RESULT:
        for i in reversed(chosen):
            if fault.keep_position:
                results[i] = None
            else:
                del results[i]
    return SimResponse(200, _dumps(results), {"content-type": "application/json"})


def _dumps(payload: Any) -> bytes:
    return json.dumps(payload, default=str).encode()


def _record_error(code: str, message: str, fields: list[str] | None = None) -> dict[str, Any]:
    return {"success": False, "errors": [{"statusCode": code, "message": message, "fields": fields or []}]}


def _upsert_one(
    state: NexusCrmState, obj: _Object, key_field: str, raw: dict[str, Any], locked: frozenset[str],
    keys: Counter[str], undo: list[tuple[str, dict[str, Any] | None]],
) -> dict[str, Any]:
    """Validate and write one record (its old state goes on `undo`)."""
    attributes = raw.get("attributes")
    if not isinstance(attributes, dict) or attributes.get("type") != obj.name:
        return _record_error("INVALID_TYPE", f"Each record must carry attributes.type = {obj.name}")
    values = {k: v for k, v in raw.items() if k != "attributes"}
    key = values.get(key_field)
    if key in (None, ""):
        return _record_error("MISSING_ARGUMENT", f"Upsert requires a value for {key_field}", [key_field])
    if keys[str(key)] > 1:
        return _record_error("DUPLICATE_VALUE", f"Duplicate external id specified: {key}", [key_field])
    if str(key) in locked:
        return _record_error("UNABLE_TO_LOCK_ROW", "unable to obtain exclusive access to this record or 1 records")
    matches = obj.find(key_field, key)
    if len(matches) > 1:
        message = f"{key_field}: more than one record found for external id field: {matches}"
        return _record_error("DUPLICATE_EXTERNAL_ID", message, [key_field])
    existing = obj.records.get(matches[0]) if matches else None
    problem = _field_problem(obj, values, existing)
    if problem:
        return problem
    merged = {**(existing or {}), **values}
    for rule in obj.rules:
        message = rule(merged)
        if message:
            return _record_error("FIELD_CUSTOM_VALIDATION_EXCEPTION", message)
    record_id = existing["Id"] if existing else state._new_id(obj)
    for name, spec in obj.fields.items():
        if not spec.unique or merged.get(name) is None:
            continue
        others = [i for i in obj.find(name, merged[name]) if i != record_id]
        if others:
            message = f"duplicate value found: {name} duplicates value on record with id: {others[0]}"
            return _record_error("DUPLICATE_VALUE", message, [name])
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if existing is None:
        defaults = {n: False for n, s in obj.fields.items() if s.defaulted_on_create and n not in merged}
        merged = {**defaults, **merged}
    merged.update(Id=record_id, LastModifiedDate=now, CreatedDate=existing["CreatedDate"] if existing else now)
    undo.append((record_id, existing))
    obj.store(record_id, merged)
    return {"id": record_id, "success": True, "errors": [], "created": existing is None}


def _field_problem(obj: _Object, values: dict[str, Any], existing: dict[str, Any] | None) -> dict[str, Any] | None:
    """The first field-level error of a record: access (FLS/CRUD), limits, required fields."""
    action = "updateable" if existing else "createable"
    denied = [name for name in values if not getattr(obj.fields[name], action)]
    if denied:
        return _record_error(
            "INVALID_FIELD_FOR_INSERT_UPDATE",
            f"Unable to create/update fields: {', '.join(denied)}. Please check the security settings of this field.",
            denied,
        )
    for name, value in values.items():
        error = record_error(obj.fields[name], value)
        if error:
            return _record_error(*error, [name])
    if existing is None:
        missing = [n for n, spec in obj.fields.items() if spec.required_on_create and n not in SERVER_MANAGED_FIELDS
                   and values.get(n) is None]
        if missing:
            return _record_error("REQUIRED_FIELD_MISSING", f"Required fields are missing: [{', '.join(missing)}]",
                                 missing)
    return None


# -- adapters -------------------------------------------------------------------------


class SimulatorTransport(httpx.BaseTransport):
    """Sync in-process transport: `httpx.Client(transport=SimulatorTransport(state))`."""

    def __init__(self, state: NexusCrmState) -> None:
        self.state = state

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        base_url = f"{request.url.scheme}://{request.url.netloc.decode('ascii')}"
        auth = request.headers.get("authorization")
        sim = handle(self.state, SimRequest(request.method, request.url.path, auth, request.read(), base_url,
                                            request.url.query.decode("ascii")))
        if sim.hang_s is not None:
            raise httpx.ReadTimeout("simulated read timeout after the write was applied", request=request)
        return httpx.Response(sim.status, headers=sim.headers, content=sim.body, request=request)


def build_nexuscrm_app(state: NexusCrmState) -> Starlette:
    async def endpoint(request: Request) -> Response:
        base_url = str(request.base_url).rstrip("/")
        auth = request.headers.get("authorization")
        sim_request = SimRequest(request.method, request.url.path, auth, await request.body(), base_url,
                                 request.url.query)
        # handle() takes locks and may sleep (latency), so it runs off the event loop.
        sim = await run_in_threadpool(handle, state, sim_request)
        if sim.hang_s is not None:
            await anyio.sleep(sim.hang_s)
        return Response(sim.body, status_code=sim.status, headers=sim.headers)

    return Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST", "PATCH", "PUT", "DELETE"])])
