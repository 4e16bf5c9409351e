"""Transport-only client for NexusCRM, a Salesforce-compatible REST API (v63).

It knows OAuth (`nexuscrm_auth.ClientCredentialsAuth`), describe, sObject Collections
upsert and the retry policy of docs/design/writeback-run.md, on the shared HTTP core
(`integrations.http`: egress limited to the configured origin, redirects never
followed, calls counted). It knows no object's fields or business rules: callers pass
the object, its field contract and ready-made records.

An upsert never raises for what the CRM answered: `BatchWriteOutcome` says, per record,
what happened, and `stop_reason` says when the run must stop after persisting the
batch's evidence (the org's API allocation spent, a rejected whole request, an
authentication failure).

Never logged or put in an exception: client credentials, tokens, auth headers,
OAuth responses, record payloads.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal, Self
from urllib.parse import quote, urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from nexus_pipelines.backoff import capped_exponential
from nexus_pipelines.integrations.http import (
    ENDPOINT,
    CallCounter,
    EgressRefused,
    make_client,
    origin_of,
    parse_retry_after,
)
from nexus_pipelines.integrations.nexuscrm_auth import (
    REQUEST_LIMIT_EXCEEDED,
    ApiLimitExceeded,
    AuthError,
    ClientCredentialsAuth,
    NexusCrmError,
    NexusCrmResponseError,
    OAuthToken,
    TokenUnavailable,
    error_code,
    limit_exceeded,
    parse_token,
    validation_problem,
)
from nexus_pipelines.redaction import one_line, register_secret

__all__ = ["ApiLimitExceeded", "AuthError", "NexusCrmError", "NexusCrmResponseError", "parse_token"]

logger = logging.getLogger(__name__)

API_VERSION = "v63.0"
MAX_BATCH_RECORDS = 200
DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=60.0, write=30.0, pool=5.0)
DEFAULT_LIMITS = httpx.Limits(max_connections=4, max_keepalive_connections=4)
MAX_ERROR_MESSAGE_CHARS = 500
# Salesforce allows 16,384 bytes of URI and headers together (414/431 beyond): a query's
# encoded SOQL keeps to half of that, leaving the rest to the URL's path and the headers.
MAX_QUERY_CHARS = 8192
# The allocation is a rolling 24-hour window: rows refused by it wait an hour, long
# enough for old calls to age out, short enough not to lose the day.
ALLOCATION_RETRY_S = 3600.0

# Per-record error codes that may succeed on a later attempt.
RETRYABLE_ERROR_CODES = frozenset({"UNABLE_TO_LOCK_ROW", REQUEST_LIMIT_EXCEEDED, "SERVER_UNAVAILABLE", "UNACCOUNTED"})
# Permanent failures that mean the target's uniqueness contract is broken: alert.
BLOCKING_ERROR_CODES = frozenset({"DUPLICATE_VALUE", "DUPLICATE_EXTERNAL_ID"})
# Everything else (validation, FLS/CRUD, invalid field/value, unknown) is permanent.

_TRANSIENT_STATUSES = frozenset({408, 429})
# API names and error codes: safe in a URL path, a log line or a ledger column.
_IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,79}$")
# A Salesforce record id: 15 case-sensitive letters and digits, or 18 with the checksum suffix.
CRM_RECORD_ID_PATTERN = r"^[A-Za-z0-9]{15}(?:[A-Za-z0-9]{3})?$"
_LIMIT_INFO = re.compile(r"(?:^|[;,\s])api-usage=(\d+)/(\d+)")
_NOT_VISIBLE = "does not exist or is not visible to the integration user"


class NexusCrmConfigError(NexusCrmError):
    pass


class ObjectNotFound(NexusCrmError):
    pass


class PreflightError(NexusCrmError):
    def __init__(self, object_name: str, problems: list[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(f"NexusCRM preflight failed for {object_name}: " + "; ".join(problems))


class NexusCrmUnavailable(NexusCrmError):
    """Token or describe kept failing transiently until the attempts ran out."""


def longest_batch_call_s(max_attempts: int, max_backoff_s: float, timeout: httpx.Timeout = DEFAULT_TIMEOUT) -> float:
    """The longest one `upsert_batch` can take: every attempt (a 401, the token refresh and
    the resend) runs into every timeout and waits the longest backoff before the next (a
    longer Retry-After is not waited out)."""
    per_request = sum(t or 0.0 for t in (timeout.connect, timeout.write, timeout.read, timeout.pool))
    return max_attempts * 3 * per_request + (max_attempts - 1) * max_backoff_s


def is_retryable(error_code: str) -> bool:
    return error_code in RETRYABLE_ERROR_CODES


def is_blocking(error_code: str | None) -> bool:
    return error_code in BLOCKING_ERROR_CODES


def sanitize_error_message(text: str, limit: int = MAX_ERROR_MESSAGE_CHARS) -> str:
    """One line, secrets and email addresses redacted (the one redaction rule), at most `limit` characters."""
    return one_line(text, limit)


def _check_url(url: str, source: str, allow_http: bool) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.netloc:
        raise NexusCrmConfigError(f"{source} is not an absolute http(s) URL")
    if parts.scheme == "http" and not allow_http:
        raise NexusCrmConfigError(f"{source} must use https; plain http is allowed only for local runs")


def _check_api_name(name: str) -> str:
    if not _IDENTIFIER.match(name):
        raise ValueError(f"not a NexusCRM API name: {name!r}")
    return name


class NexusCrmCredentials(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str
    client_id: SecretStr
    client_secret: SecretStr
    allow_http: bool = False

    @model_validator(mode="after")
    def _check_base_url(self) -> Self:
        _check_url(self.base_url, "NexusCRM base URL", self.allow_http)
        return self

    @classmethod
    def from_env(
        cls,
        base_url_env: str,
        client_id_env: str,
        client_secret_env: str,
        *,
        allow_http: bool,
        environ: Mapping[str, str] | None = None,
    ) -> NexusCrmCredentials:
        """Read the named variables; the id and secret join the redaction rule."""
        env = os.environ if environ is None else environ
        values = {}
        names = {"base_url": base_url_env, "client_id": client_id_env, "client_secret": client_secret_env}
        for key, var in names.items():
            value = env.get(var, "").strip()
            if not value:
                what = key.replace("_", " ")
                raise NexusCrmConfigError(f"environment variable {var} is not set; set it to the NexusCRM {what}")
            values[key] = value
        _check_url(values["base_url"], f"NexusCRM base URL from {base_url_env}", allow_http)
        register_secret(values["client_id"])
        register_secret(values["client_secret"])
        return cls(**values, allow_http=allow_http)


class FieldDescribe(BaseModel):
    # A real describe carries dozens of keys per field; these are the ones the contract checks.
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True, populate_by_name=True)

    name: str
    type: str
    createable: bool
    updateable: bool
    external_id: bool = Field(alias="externalId")
    unique: bool
    id_lookup: bool = Field(alias="idLookup")
    nillable: bool
    length: int
    precision: int
    scale: int


FieldType = Literal["string", "boolean", "double", "currency", "percent", "date", "datetime"]
TEXT_TYPES = frozenset({"string"})
NUMBER_TYPES = frozenset({"double", "currency", "percent"})


def check_checkbox(name: str, field_type: str, nillable: bool) -> None:
    """Salesforce never lets a checkbox be null (it is false unless set): raise ValueError
    for a boolean field declared or deployed as nillable."""
    if field_type == "boolean" and nillable:
        raise ValueError(f"{name}: a boolean (checkbox) field is never nillable in Salesforce; declare nillable=False")


@dataclass(frozen=True)
class FieldContract:
    """One field of the target object as a writer relies on it: declared once (by a job's
    mapper), compared with the CRM's describe before any write, and what the simulator
    builds its object from. `length` is for text, `precision`/`scale` for numbers."""

    name: str
    type: FieldType
    length: int = 0
    precision: int = 0
    scale: int = 0
    nillable: bool = True
    external_id: bool = False  # unique and an idLookup field: the upsert key

    def __post_init__(self) -> None:
        _check_api_name(self.name)
        text, number = self.type in TEXT_TYPES, self.type in NUMBER_TYPES
        if text != (self.length > 0) or (not text and self.length):
            raise ValueError(f"{self.name}: a length is declared for text fields, and only for them")
        if number != (self.precision > 0) or not 0 <= self.scale <= self.precision or (self.scale and not number):
            raise ValueError(f"{self.name}: precision >= scale >= 0 is declared for number fields, and only for them")
        if self.external_id and (self.type != "string" or self.nillable):
            raise ValueError(f"{self.name}: the external id must be a non-nillable string field")
        check_checkbox(self.name, self.type, self.nillable)

    def drift(self, field: FieldDescribe) -> list[str]:
        """How the CRM's field differs from this contract (type, limits, nillability)."""
        checks = (("type", self.type, field.type), ("length", self.length, field.length),
                  ("precision", self.precision, field.precision), ("scale", self.scale, field.scale),
                  ("nillable", self.nillable, field.nillable))
        return [f"owned field {self.name} has {what} {got!r} in the CRM, the job declares {want!r}"
                for what, want, got in checks if want != got]


class ObjectDescribe(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    name: str
    fields: tuple[FieldDescribe, ...]

    def field(self, name: str) -> FieldDescribe | None:
        return next((f for f in self.fields if f.name == name), None)


class _UpsertError(BaseModel):
    # Error items may grow keys (extendedErrorDetails); only these two are read.
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    statusCode: str
    message: str = ""


class _UpsertItem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    id: str | None = Field(default=None, pattern=CRM_RECORD_ID_PATTERN)  # another shape: no valid result
    success: bool
    created: bool | None = None
    errors: list[_UpsertError] = []

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.success and not self.id:
            raise ValueError("a successful item must carry an id")
        if not self.success and not self.errors:
            raise ValueError("a failed item must carry errors")
        return self


class _QueryPage(BaseModel):
    """One page of a SOQL query's answer (`totalSize`, `done`, `nextRecordsUrl`, `records`)."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    totalSize: int
    done: bool
    nextRecordsUrl: str | None = Field(default=None, pattern=r"^/services/data/v[\d.]+/query/[\w-]+$")
    records: list[dict[str, Any]]

    @model_validator(mode="after")
    def _pageable(self) -> Self:
        if not self.done and not self.nextRecordsUrl:
            raise ValueError("a page that is not the last must carry nextRecordsUrl")
        return self


@dataclass(frozen=True)
class RecordWriteResult:
    external_id: str
    success: bool
    crm_record_id: str | None
    error_code: str | None
    error_message: str | None
    retryable: bool
    created: bool | None = None  # success only: the CRM's created/updated flag


@dataclass(frozen=True)
class ApiLimit:
    used: int
    max: int

    def __str__(self) -> str:
        return f"{self.used}/{self.max}"


@dataclass(frozen=True)
class BatchWriteOutcome:
    results: tuple[RecordWriteResult, ...]  # one per requested record, in request order
    http_status: int | None  # of the last response; None when none arrived
    duration_ms: int
    attempts: int  # upsert requests sent (a token refresh's resend included)
    limit_info: ApiLimit | None
    batch_error: str | None  # set when the request as a whole failed or its body was unusable
    retry_after_s: float | None  # when the batch's retryable rows may be sent again, if the CRM said
    stop_reason: str | None = None  # the run must stop after persisting this batch (one line)

    @property
    def created_external_ids(self) -> frozenset[str]:
        return frozenset(r.external_id for r in self.results if r.created)

    @property
    def blocking_failures(self) -> tuple[RecordWriteResult, ...]:
        return tuple(r for r in self.results if is_blocking(r.error_code))


def parse_limit_info(header: str | None) -> ApiLimit | None:
    """`api-usage=N/M` of a Sforce-Limit-Info header (not `per-app-api-usage`)."""
    match = _LIMIT_INFO.search(header or "")
    return ApiLimit(int(match.group(1)), int(match.group(2))) if match else None


@dataclass(frozen=True)
class _Transient:
    code: str
    status: int | None
    retry_after: float | None


class _Exhausted(Exception):
    def __init__(self, failure: _Transient, attempts: int) -> None:
        self.failure = failure
        self.attempts = attempts


class _Halted(Exception):
    """The CRM refused in a way no retry in this run can fix; `cause` says how."""

    def __init__(self, cause: NexusCrmError) -> None:
        self.cause = cause


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
        message = body[0]["message"] if isinstance(body, list) else body.get("message", "")
    except (ValueError, LookupError, TypeError, AttributeError):
        message = ""
    return message if isinstance(message, str) else ""


class NexusCrmClient:
    """One pooled HTTP client per instance; use as a context manager or call close().

    Not safe for concurrent use from several threads (the token is shared state).
    Tests pass `transport=SimulatorTransport(state)` from the NexusCRM simulator.
    """

    def __init__(
        self,
        credentials: NexusCrmCredentials,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        limits: httpx.Limits = DEFAULT_LIMITS,
        max_attempts: int = 5,
        base_backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        if max_attempts < 1 or base_backoff_s < 0 or max_backoff_s < base_backoff_s:
            raise ValueError("need max_attempts >= 1 and 0 <= base_backoff_s <= max_backoff_s")
        self._credentials = credentials
        self._base_url = credentials.base_url.rstrip("/")
        self._auth = ClientCredentialsAuth(f"{self._base_url}/services/oauth2/token", credentials.client_id,
                                           credentials.client_secret, self._check_token)
        self._counter = CallCounter()
        self._http = make_client(self._base_url, transport=transport, counter=self._counter, auth=self._auth,
                                 headers={"Accept": "application/json"}, timeout=timeout, limits=limits)
        self._max_attempts = max_attempts
        self._base_backoff_s = base_backoff_s
        self._max_backoff_s = max_backoff_s
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.api_usage: ApiLimit | None = None  # the last Sforce-Limit-Info seen

    def __repr__(self) -> str:
        return f"NexusCrmClient(base_url={self._credentials.base_url!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def call_counts(self) -> dict[str, int]:
        """Requests per endpoint (token, describe, upsert) and per `endpoint:outcome`
        (status_NNN or an exception name), for run metrics."""
        return self._counter.snapshot()

    # -- auth -------------------------------------------------------------------------

    def authenticate(self) -> None:
        """Fetch a fresh token (preflight step 1); later calls reuse it and refresh it on a 401."""
        self._auth.invalidate()
        try:
            response, _ = self._retrying("token", lambda: self._http.send(self._auth.token_request(), auth=None))
            self._auth.accept_token_response(response)
        except _Exhausted as exc:
            raise NexusCrmUnavailable(
                f"NexusCRM token endpoint failed with {exc.failure.code} on {exc.attempts} attempts; try again later"
            ) from None
        except _Halted as exc:
            raise exc.cause from None

    def _check_token(self, token: OAuthToken) -> None:
        source = "NexusCRM instance_url from the token response"
        _check_url(token.instance_url, source, self._credentials.allow_http)
        if origin_of(token.instance_url) != origin_of(self._base_url):
            raise NexusCrmResponseError(f"{source} is on another origin than the configured NexusCRM base URL; "
                                        "this client may only call that origin")

    def _data_url(self, path: str) -> str:
        if self._auth.instance_url is None:
            self.authenticate()
        assert self._auth.instance_url is not None
        return f"{self._auth.instance_url.rstrip('/')}/services/data/{API_VERSION}{path}"

    # -- retry core -------------------------------------------------------------------

    def _retrying(self, endpoint: str, send: Callable[[], httpx.Response]) -> tuple[httpx.Response, int]:
        """The in-call retry policy: retry timeouts, connection failures, 408, 429 and 5xx with capped
        full-jitter backoff (a Retry-After wins); return the first other response and the
        attempts made. Raises _Exhausted when the attempts run out, _Halted when the CRM
        refused in a way no retry in this run can fix."""
        attempts = 0
        while True:
            attempts += 1
            try:
                response = send()
            except EgressRefused as exc:
                raise NexusCrmConfigError(one_line(str(exc))) from None
            except TokenUnavailable as exc:
                failure = _Transient(f"TOKEN_HTTP_{exc.status}", exc.status, exc.retry_after)
            except (AuthError, ApiLimitExceeded, NexusCrmResponseError, NexusCrmConfigError) as exc:
                raise _Halted(exc) from None
            except httpx.TimeoutException:
                self._auth.request_unanswered()
                failure = _Transient("TIMEOUT", None, None)
            except (httpx.TransportError, httpx.DecodingError):
                # Connection reset, protocol or proxy failure, or a body that cannot be decoded:
                # the request may have been applied, so it is retried like a timeout.
                self._auth.request_unanswered()
                failure = _Transient("CONNECTION_ERROR", None, None)
            else:
                self.api_usage = parse_limit_info(response.headers.get("Sforce-Limit-Info")) or self.api_usage
                limited = limit_exceeded(endpoint, response)
                if limited:
                    raise _Halted(limited)
                status = response.status_code
                if status not in _TRANSIENT_STATUSES and status < 500:
                    return response, attempts
                failure = _Transient(f"HTTP_{status}", status, parse_retry_after(response.headers.get("Retry-After")))
            # A Retry-After beyond our cap is not waited out: the batch is retried in a later run.
            if attempts >= self._max_attempts or (failure.retry_after or 0) > self._max_backoff_s:
                raise _Exhausted(failure, attempts)
            delay = failure.retry_after if failure.retry_after is not None else self._jitter(attempts)
            logger.warning(
                "nexuscrm %s %s on attempt %d/%d; retrying in %.2fs",
                endpoint, failure.code, attempts, self._max_attempts, delay,
            )
            self._sleep(delay)

    def _request(self, endpoint: str, method: str, url: str, **kwargs: Any) -> Callable[[], httpx.Response]:
        return lambda: self._http.request(method, url, extensions={ENDPOINT: endpoint}, **kwargs)

    def _jitter(self, attempt: int) -> float:
        # Full jitter: uniform over [0, min(cap, base * 2^(attempt-1))].
        return self._rng.uniform(0.0, capped_exponential(attempt, self._base_backoff_s, self._max_backoff_s))

    # -- describe / preflight ---------------------------------------------------------

    def describe(self, object_name: str) -> ObjectDescribe:
        url = self._data_url(f"/sobjects/{_check_api_name(object_name)}/describe")
        try:
            response, _ = self._retrying("describe", self._request("describe", "GET", url))
        except _Exhausted as exc:
            raise NexusCrmUnavailable(
                f"NexusCRM describe {object_name} failed with {exc.failure.code} on {exc.attempts} attempts; "
                "try again later"
            ) from None
        except _Halted as exc:
            raise exc.cause from None
        if response.status_code == 404:
            raise ObjectNotFound(f"NexusCRM object {object_name} {_NOT_VISIBLE}")
        if response.status_code != 200:
            code = error_code(response) or "no error code"
            raise NexusCrmResponseError(f"NexusCRM describe {object_name} failed (HTTP {response.status_code}, {code})")
        try:
            return ObjectDescribe.model_validate_json(response.content)
        except ValidationError as exc:
            problem = validation_problem(exc)
            raise NexusCrmResponseError(f"NexusCRM describe {object_name} response is malformed ({problem})") from None

    def preflight(self, object_name: str, contract: Iterable[FieldContract]) -> ObjectDescribe:
        """Verify the write contract before any write (the preflight of docs/design/writeback-run.md): the object, the
        external ID field, and every owned field present, createable, updateable and as
        declared (type, length, precision/scale, nillability). Raises PreflightError listing
        every problem."""
        try:
            describe = self.describe(object_name)
        except ObjectNotFound:
            raise PreflightError(object_name, [f"object {_NOT_VISIBLE}"]) from None
        problems = []
        for spec in sorted(contract, key=lambda c: (not c.external_id, c.name)):
            field = describe.field(spec.name)
            role = "external id field" if spec.external_id else "owned field"
            if field is None:
                problems.append(f"{role} {spec.name} does not exist")
                continue
            if spec.external_id:
                problems += [f"external id field {spec.name} is not {what}" for ok, what in (
                    (field.external_id, "marked External ID"), (field.unique, "unique"),
                    (field.id_lookup, "an idLookup field")) if not ok]
            problems += [f"{role} {spec.name} is not {what}" for ok, what in (
                (field.createable, "createable"), (field.updateable, "updateable")) if not ok]
            problems += spec.drift(field)
        if problems:
            raise PreflightError(object_name, problems)
        return describe

    # -- read back --------------------------------------------------------------------

    def ids_by_external_id(self, object_name: str, external_id_field: str,
                           external_ids: Iterable[str]) -> tuple[dict[str, str], int]:
        """The CRM record id of each of `external_ids` that exists, read with SOQL
        (`GET /query?q=SELECT Id, <field> FROM <object> WHERE <field> IN (...)`), and the
        requests made: one per chunk of ids that keeps the URI within Salesforce's limit
        (and one per further page, should the CRM page the answer). Raises NexusCrmError."""
        obj, key = _check_api_name(object_name), _check_api_name(external_id_field)
        found: dict[str, str] = {}
        calls = 0
        for chunk in _soql_chunks(obj, key, list(external_ids)):
            url: str | None = self._data_url("/query")
            params: dict[str, str] | None = {"q": chunk}
            while url is not None:
                page = self._query_page(object_name, url, params)
                calls += 1
                for record in page.records:
                    record_id, value = record.get("Id"), record.get(key)
                    if not (isinstance(value, str) and isinstance(record_id, str)
                            and re.match(CRM_RECORD_ID_PATTERN, record_id)):
                        raise NexusCrmResponseError(f"NexusCRM query of {object_name} by external id: a record "
                                                    f"without a valid Id or {key} in the response")
                    found[value] = record_id
                url = None if page.done else f"{self._auth.instance_url.rstrip('/')}{page.nextRecordsUrl}"
                params = None
        return found, calls

    def _query_page(self, object_name: str, url: str, params: dict[str, str] | None) -> _QueryPage:
        what = f"NexusCRM query of {object_name} by external id"
        try:
            response, _ = self._retrying("query", self._request("query", "GET", url, params=params))
        except _Exhausted as exc:
            raise NexusCrmUnavailable(f"{what} failed with {exc.failure.code} on {exc.attempts} attempts; "
                                      "try again later") from None
        except _Halted as exc:
            raise exc.cause from None
        if response.status_code != 200:
            code = error_code(response) or f"HTTP_{response.status_code}"
            raise NexusCrmResponseError(sanitize_error_message(
                f"{what} failed (HTTP {response.status_code} {code}: {_error_message(response) or 'no message'})"))
        try:
            return _QueryPage.model_validate_json(response.content)
        except ValidationError as exc:
            raise NexusCrmResponseError(f"{what}: the response is malformed ({validation_problem(exc)})") from None

    # -- write ------------------------------------------------------------------------

    def upsert_batch(self, object_name: str, external_id_field: str, records: list[dict[str, Any]], *,
                     all_or_none: bool = False) -> BatchWriteOutcome:
        """sObject Collections upsert. Returns one result per record, in order: transient
        failures that outlast the retries, a rejected whole request, a spent API allocation
        and an authentication failure come back as retryable results (the last three with
        `stop_reason`)."""
        external_ids = _batch_external_ids(external_id_field, records)
        path = f"/composite/sobjects/{_check_api_name(object_name)}/{_check_api_name(external_id_field)}"
        url = self._data_url(path)
        body = encode_json({"allOrNone": all_or_none,
                            "records": [{"attributes": {"type": object_name}, **r} for r in records]})
        started, sent_before = time.monotonic(), self._counter.total("upsert")
        try:
            response, _ = self._retrying("upsert", self._request(
                "upsert", "PATCH", url, content=body, headers={"Content-Type": "application/json"}))
        except _Exhausted as exc:
            f = exc.failure
            what = "the request timed out or the connection failed" if f.status is None else f"HTTP {f.status}"
            message = f"{what} on {exc.attempts} attempts; the write may or may not have been applied"
            results = [_failure(x, f.code, message, retryable=True) for x in external_ids]
            return self._outcome(started, sent_before, results, f.status, batch_error=f.code,
                                 retry_after=f.retry_after)
        except _Halted as exc:
            return self._halted(started, sent_before, external_ids, exc.cause)
        status = response.status_code
        if not 200 <= status < 300:
            # A request-level rejection (400 INVALID_FIELD, JSON_PARSER_ERROR, a 404, a
            # redirect): a contract or code error. Nothing was written; the rows stay
            # eligible for the next run (retry_after 0) and this run stops.
            code = error_code(response) or f"HTTP_{status}"
            message = _error_message(response) or "no message"
            why = sanitize_error_message(f"NexusCRM rejected the whole upsert request (HTTP {status} {code}: {message})")
            results = [_failure(x, code, why, retryable=True) for x in external_ids]
            return self._outcome(started, sent_before, results, status, batch_error=code, retry_after=0.0,
                                 stop_reason=f"{why}; a contract or code error: fix it, the rows stay eligible "
                                             "for the next run")
        results, usable = _normalize(external_ids, response.content)
        return self._outcome(started, sent_before, results, status,
                             batch_error=None if usable else "UNACCOUNTED")

    def _halted(self, started: float, sent_before: int, external_ids: list[str],
                cause: NexusCrmError) -> BatchWriteOutcome:
        if isinstance(cause, ApiLimitExceeded):
            # Nothing was written by the refused request; wait for the allocation, not a second.
            results = [_failure(x, REQUEST_LIMIT_EXCEEDED, str(cause), retryable=True) for x in external_ids]
            wait = max(cause.retry_after or 0.0, ALLOCATION_RETRY_S)
            return self._outcome(started, sent_before, results, 403, batch_error=REQUEST_LIMIT_EXCEEDED,
                                 retry_after=wait, stop_reason=str(cause))
        # An authentication or contract failure, maybe after earlier attempts that were applied.
        results = [_unaccounted(x, str(cause)) for x in external_ids]
        return self._outcome(started, sent_before, results, None, batch_error=type(cause).__name__,
                             stop_reason=str(cause))

    def _outcome(self, started: float, sent_before: int, results: list[RecordWriteResult], status: int | None, *,
                 batch_error: str | None = None, retry_after: float | None = None,
                 stop_reason: str | None = None) -> BatchWriteOutcome:
        return BatchWriteOutcome(
            results=tuple(results), http_status=status, duration_ms=round((time.monotonic() - started) * 1000),
            attempts=self._counter.total("upsert") - sent_before, limit_info=self.api_usage,
            batch_error=batch_error, retry_after_s=retry_after, stop_reason=stop_reason)


def encode_json(value: Any) -> bytes:
    """JSON with Decimal values written as exact JSON numbers (never through a float)."""
    return _encode(value).encode("utf-8")


def _encode(value: Any) -> str:
    if type(value) is Decimal:
        if not value.is_finite():
            raise ValueError("a decimal must be finite")
        return format(value, "f")
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{_encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_encode(v) for v in value) + "]"
    return json.dumps(value)


def _batch_external_ids(external_id_field: str, records: list[dict[str, Any]]) -> list[str]:
    if not records or len(records) > MAX_BATCH_RECORDS:
        raise ValueError(f"a Composite Collections batch holds 1..{MAX_BATCH_RECORDS} records, got {len(records)}")
    external_ids = []
    for position, record in enumerate(records):
        value = record.get(external_id_field)
        if not isinstance(value, str) or not value:
            raise ValueError(f"record {position} has no string value for the external id field {external_id_field}")
        if "attributes" in record:
            raise ValueError(f"record {position} must not carry 'attributes'; the client sets them")
        external_ids.append(value)
    if len(set(external_ids)) != len(external_ids):
        raise ValueError("a batch must not repeat an external id")
    return external_ids


def soql_string(value: str) -> str:
    """A SOQL string literal (quotes, backslashes and control characters escaped)."""
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return "'" + escaped.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t") + "'"


def _soql_chunks(object_name: str, key: str, external_ids: list[str]) -> Iterator[str]:
    """`SELECT Id, key FROM object WHERE key IN (...)` over consecutive chunks of the ids, each
    short enough that its URL-encoded form stays within MAX_QUERY_CHARS."""
    head, chunk, size = f"SELECT Id, {key} FROM {object_name} WHERE {key} IN (", [], 0
    for external_id in external_ids:
        literal = soql_string(external_id)
        cost = len(quote(literal, safe="")) + 3  # and the encoded comma
        if chunk and len(quote(head, safe="")) + size + cost > MAX_QUERY_CHARS:
            yield head + ",".join(chunk) + ")"
            chunk, size = [], 0
        chunk.append(literal)
        size += cost
    if chunk:
        yield head + ",".join(chunk) + ")"


def _failure(external_id: str, code: str, message: str, retryable: bool | None = None) -> RecordWriteResult:
    return RecordWriteResult(
        external_id=external_id,
        success=False,
        crm_record_id=None,
        error_code=code,
        error_message=sanitize_error_message(message),
        retryable=is_retryable(code) if retryable is None else retryable,
    )


def _unaccounted(external_id: str, why: str) -> RecordWriteResult:
    return _failure(external_id, "UNACCOUNTED", f"{why}; the write may or may not have been applied", retryable=True)


def _normalize(external_ids: list[str], content: bytes) -> tuple[list[RecordWriteResult], bool]:
    """Match UpsertResults to requests by position (Salesforce returns them in request
    order; the caller checks what it can against its ledger). A body whose positions
    cannot be trusted leaves every record unaccounted; an unusable item leaves only its
    own record unaccounted. Returns (results, body usable)."""
    try:
        items = json.loads(content)
    except ValueError:
        return [_unaccounted(x, "response body is not JSON") for x in external_ids], False
    if not isinstance(items, list) or len(items) != len(external_ids):
        why = "response is not a list"
        if isinstance(items, list):
            why = f"response has {len(items)} results for {len(external_ids)} records"
        return [_unaccounted(x, why) for x in external_ids], False
    results = []
    for external_id, raw in zip(external_ids, items, strict=True):
        try:
            item = _UpsertItem.model_validate(raw)
        except ValidationError:
            results.append(_unaccounted(external_id, "response has no valid result for this record"))
            continue
        if item.success:
            results.append(RecordWriteResult(external_id, True, item.id, None, None, False, bool(item.created)))
        else:
            first = item.errors[0]
            code = first.statusCode if _IDENTIFIER.match(first.statusCode) else "UNKNOWN_ERROR"
            # The code is the error_code column; the message keeps the CRM's words only.
            message = " | ".join(e.message or e.statusCode for e in item.errors)
            results.append(_failure(external_id, code, message))
    return results, True
