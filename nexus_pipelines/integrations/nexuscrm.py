"""Transport-only client for NexusCRM, a Salesforce-compatible REST API (v63).

It knows OAuth, describe and Composite Collections Upsert, and the retry policy of
seed 004 section 11. It knows no object's fields or business rules: callers pass the
object, the external ID field and ready-made records.

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
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from nexus_pipelines.backoff import capped_exponential
from nexus_pipelines.integrations.http import parse_retry_after
from nexus_pipelines.redaction import one_line

logger = logging.getLogger(__name__)

API_VERSION = "v63.0"
MAX_BATCH_RECORDS = 200
DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=60.0, write=30.0, pool=5.0)
DEFAULT_LIMITS = httpx.Limits(max_connections=4, max_keepalive_connections=4)
MAX_ERROR_MESSAGE_CHARS = 500

# Per-record / whole-request error codes that may succeed on a later attempt.
RETRYABLE_ERROR_CODES = frozenset({"UNABLE_TO_LOCK_ROW", "REQUEST_LIMIT_EXCEEDED", "SERVER_UNAVAILABLE", "UNACCOUNTED"})
# Permanent failures that mean the target's uniqueness contract is broken: alert.
BLOCKING_ERROR_CODES = frozenset({"DUPLICATE_VALUE", "DUPLICATE_EXTERNAL_ID"})
# Everything else (validation, FLS/CRUD, invalid field/value, unknown) is permanent.

_TRANSIENT_STATUSES = frozenset({408, 429})
# API names and error codes: safe in a URL path, a log line or a ledger column.
_IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,79}$")
_LIMIT_INFO = re.compile(r"api-usage=(\d+)/(\d+)")
_NOT_VISIBLE = "does not exist or is not visible to the integration user"


class NexusCrmError(Exception):
    """Base of every error this client raises; messages are one line and secret-free."""


class NexusCrmConfigError(NexusCrmError):
    pass


class AuthError(NexusCrmError):
    pass


class ObjectNotFound(NexusCrmError):
    pass


class PreflightError(NexusCrmError):
    def __init__(self, object_name: str, problems: list[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(f"NexusCRM preflight failed for {object_name}: " + "; ".join(problems))


class NexusCrmResponseError(NexusCrmError):
    """The API answered with an unexpected status or a body that breaks the contract."""


class NexusCrmUnavailable(NexusCrmError):
    """Token or describe kept failing transiently until the attempts ran out."""


def longest_batch_call_s(max_attempts: int, max_backoff_s: float, timeout: httpx.Timeout = DEFAULT_TIMEOUT) -> float:
    """The longest one `upsert_batch` can take: every attempt runs into every timeout and
    waits the longest backoff before the next (a longer Retry-After is not waited out)."""
    per_attempt = sum(t or 0.0 for t in (timeout.connect, timeout.write, timeout.read, timeout.pool))
    return max_attempts * per_attempt + (max_attempts - 1) * max_backoff_s


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
        return cls(**values, allow_http=allow_http)


class OAuthToken(BaseModel):
    # Real token responses carry more keys (id, issued_at, signature, scope).
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    access_token: SecretStr = Field(min_length=1)
    instance_url: str = Field(min_length=1)
    token_type: str

    @field_validator("token_type")
    @classmethod
    def _bearer(cls, value: str) -> str:
        if value.lower() != "bearer":
            raise ValueError("token_type must be Bearer")
        return value


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

    id: str | None = None
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


@dataclass(frozen=True)
class RecordWriteResult:
    external_id: str
    success: bool
    crm_record_id: str | None
    error_code: str | None
    error_message: str | None
    retryable: bool


@dataclass(frozen=True)
class ApiLimit:
    used: int
    max: int


@dataclass(frozen=True)
class BatchWriteOutcome:
    results: tuple[RecordWriteResult, ...]  # one per requested record, in request order
    created_external_ids: frozenset[str]
    http_status: int | None  # of the last response; None when none arrived
    duration_ms: int
    attempts: int  # upsert requests sent, including the one after a token refresh
    limit_info: ApiLimit | None
    batch_error: str | None  # set when the request as a whole failed or its body was unusable
    retry_after_s: float | None  # the server's last Retry-After, for scheduling a later retry

    @property
    def blocking_failures(self) -> tuple[RecordWriteResult, ...]:
        return tuple(r for r in self.results if is_blocking(r.error_code))


def parse_token(content: bytes) -> OAuthToken:
    try:
        return OAuthToken.model_validate_json(content)
    except ValidationError as exc:
        raise NexusCrmResponseError(f"NexusCRM token response is malformed ({_validation_problem(exc)})") from None


def parse_limit_info(header: str | None) -> ApiLimit | None:
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


def _error_code(response: httpx.Response) -> str | None:
    """The code of a Salesforce error body (`[{"errorCode": ...}]` or OAuth `{"error": ...}`)."""
    try:
        body = response.json()
    except ValueError:
        return None
    if isinstance(body, list) and body and isinstance(body[0], dict):
        code = body[0].get("errorCode")
    elif isinstance(body, dict):
        code = body.get("error")
    else:
        return None
    return code if isinstance(code, str) and _IDENTIFIER.match(code) else None


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
        message = body[0]["message"] if isinstance(body, list) else body.get("message", "")
    except (ValueError, LookupError, TypeError, AttributeError):
        message = ""
    return message if isinstance(message, str) else ""


def _validation_problem(exc: ValidationError) -> str:
    # Field paths only: pydantic's own text would echo the input values.
    return ", ".join(".".join(str(p) for p in e["loc"]) or "body" for e in exc.errors(include_input=False))


class NexusCrmClient:
    """One pooled httpx.Client per instance; use as a context manager or call close().

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
        self._http = httpx.Client(
            transport=transport, timeout=timeout, limits=limits, headers={"Accept": "application/json"}
        )
        self._max_attempts = max_attempts
        self._base_backoff_s = base_backoff_s
        self._max_backoff_s = max_backoff_s
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._token: OAuthToken | None = None
        self._calls: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"NexusCrmClient(base_url={self._credentials.base_url!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def call_counts(self) -> dict[str, int]:
        """HTTP requests per endpoint (token, describe, upsert) and transient failures seen
        (status_429, status_5xx, status_408, transport_error), for run metrics."""
        return dict(self._calls)

    # -- auth -------------------------------------------------------------------------

    def authenticate(self) -> None:
        """Fetch a fresh token (preflight step 1); later calls reuse it until a 401."""
        url = f"{self._base_url}/services/oauth2/token"
        form = {
            "grant_type": "client_credentials",
            "client_id": self._credentials.client_id.get_secret_value(),
            "client_secret": self._credentials.client_secret.get_secret_value(),
        }
        try:
            response, _ = self._send("token", "POST", url, authed=False, data=form)
        except _Exhausted as exc:
            raise NexusCrmUnavailable(
                f"NexusCRM token endpoint failed with {exc.failure.code} on {exc.attempts} attempts; try again later"
            ) from None
        if response.status_code != 200:
            code = _error_code(response) or "no error code"
            raise AuthError(
                f"NexusCRM refused the OAuth client_credentials request (HTTP {response.status_code}, {code}); "
                "check the client id/secret and the Connected App"
            )
        token = parse_token(response.content)
        _check_url(token.instance_url, "NexusCRM instance_url from the token response", self._credentials.allow_http)
        self._token = token

    def _bearer(self) -> dict[str, str]:
        if self._token is None:
            self.authenticate()
        assert self._token is not None
        return {"Authorization": f"Bearer {self._token.access_token.get_secret_value()}"}

    def _data_url(self, path: str) -> str:
        if self._token is None:
            self.authenticate()
        assert self._token is not None
        return f"{self._token.instance_url.rstrip('/')}/services/data/{API_VERSION}{path}"

    # -- retry core -------------------------------------------------------------------

    def _send(self, endpoint: str, method: str, url: str, *, authed: bool, **kwargs: Any) -> tuple[httpx.Response, int]:
        """Send with the section 11 policy; returns the first non-transient response and the
        number of requests sent, or raises _Exhausted. 401 refreshes the token once."""
        attempts = 0
        refreshed = False
        while True:
            headers = self._bearer() if authed else {}
            attempts += 1
            self._calls[endpoint] += 1
            try:
                response = self._http.request(method, url, headers=headers, **kwargs)
            except httpx.TimeoutException:
                failure = _Transient("TIMEOUT", None, None)
            except (httpx.TransportError, httpx.DecodingError):
                # Connection reset, protocol or proxy failure, or a body that cannot be decoded:
                # the request may have been applied, so it is retried like a timeout.
                failure = _Transient("CONNECTION_ERROR", None, None)
            else:
                status = response.status_code
                if authed and status == 401:
                    if refreshed:
                        raise AuthError(
                            f"NexusCRM rejected a freshly issued token on {endpoint} (HTTP 401); "
                            "check the integration user's API access"
                        )
                    refreshed = True
                    self._token = None
                    logger.info("nexuscrm %s got HTTP 401; refreshing the token once", endpoint)
                    continue
                if status not in _TRANSIENT_STATUSES and status < 500:
                    return response, attempts
                failure = _Transient(f"HTTP_{status}", status, parse_retry_after(response.headers.get("Retry-After")))
            self._calls[_failure_metric(failure.status)] += 1
            # A Retry-After beyond our cap is not waited out: the batch is retried in a later run.
            if attempts >= self._max_attempts or (failure.retry_after or 0) > self._max_backoff_s:
                raise _Exhausted(failure, attempts)
            delay = failure.retry_after if failure.retry_after is not None else self._jitter(attempts)
            logger.warning(
                "nexuscrm %s %s on attempt %d/%d; retrying in %.2fs",
                endpoint, failure.code, attempts, self._max_attempts, delay,
            )
            self._sleep(delay)

    def _jitter(self, attempt: int) -> float:
        # Full jitter: uniform over [0, min(cap, base * 2^(attempt-1))].
        return self._rng.uniform(0.0, capped_exponential(attempt, self._base_backoff_s, self._max_backoff_s))

    # -- describe / preflight ---------------------------------------------------------

    def describe(self, object_name: str) -> ObjectDescribe:
        url = self._data_url(f"/sobjects/{_check_api_name(object_name)}/describe")
        try:
            response, _ = self._send("describe", "GET", url, authed=True)
        except _Exhausted as exc:
            raise NexusCrmUnavailable(
                f"NexusCRM describe {object_name} failed with {exc.failure.code} on {exc.attempts} attempts; "
                "try again later"
            ) from None
        if response.status_code == 404:
            raise ObjectNotFound(f"NexusCRM object {object_name} {_NOT_VISIBLE}")
        if response.status_code != 200:
            code = _error_code(response) or "no error code"
            raise NexusCrmResponseError(f"NexusCRM describe {object_name} failed (HTTP {response.status_code}, {code})")
        try:
            return ObjectDescribe.model_validate_json(response.content)
        except ValidationError as exc:
            problem = _validation_problem(exc)
            raise NexusCrmResponseError(f"NexusCRM describe {object_name} response is malformed ({problem})") from None

    def preflight(self, object_name: str, external_id_field: str, owned_fields: Iterable[str]) -> ObjectDescribe:
        """Verify the write contract before any write (seed 004 section 9); raises PreflightError
        listing every problem."""
        try:
            describe = self.describe(object_name)
        except ObjectNotFound:
            raise PreflightError(object_name, [f"object {_NOT_VISIBLE}"]) from None
        problems = []
        key = describe.field(external_id_field)
        if key is None:
            problems.append(f"external id field {external_id_field} does not exist")
        else:
            for ok, what in (
                (key.external_id, "marked External ID"),
                (key.unique, "unique"),
                (key.id_lookup, "an idLookup field"),
            ):
                if not ok:
                    problems.append(f"external id field {external_id_field} is not {what}")
        for name in sorted(set(owned_fields)):
            spec = describe.field(name)
            if spec is None:
                problems.append(f"owned field {name} does not exist")
                continue
            for ok, what in ((spec.createable, "createable"), (spec.updateable, "updateable")):
                if not ok:
                    problems.append(f"owned field {name} is not {what}")
        if problems:
            raise PreflightError(object_name, problems)
        return describe

    # -- write ------------------------------------------------------------------------

    def upsert_batch(
        self, object_name: str, external_id_field: str, records: list[dict[str, Any]]
    ) -> BatchWriteOutcome:
        """Composite Collections Upsert with allOrNone=false. Returns one result per record, in
        order; transient failures that outlast the retries come back as retryable results."""
        external_ids = _batch_external_ids(external_id_field, records)
        path = f"/composite/sobjects/{_check_api_name(object_name)}/{_check_api_name(external_id_field)}"
        url = self._data_url(path)
        body = {"allOrNone": False, "records": [{"attributes": {"type": object_name}, **r} for r in records]}
        started = time.monotonic()
        try:
            response, attempts = self._send("upsert", "PATCH", url, authed=True, json=body)
        except _Exhausted as exc:
            f = exc.failure
            what = "the request timed out or the connection failed" if f.status is None else f"HTTP {f.status}"
            message = f"{what} on {exc.attempts} attempts; the write may or may not have been applied"
            results = [_failure(x, f.code, message, retryable=True) for x in external_ids]
            return _outcome(
                started, results, None, exc.attempts, status=f.status, batch_error=f.code, retry_after=f.retry_after
            )
        if not 200 <= response.status_code < 300:
            code = _error_code(response) or f"HTTP_{response.status_code}"
            message = _error_message(response) or f"NexusCRM rejected the whole request (HTTP {response.status_code})"
            results = [_failure(x, code, message) for x in external_ids]
            return _outcome(started, results, response, attempts, batch_error=code)
        results, created, usable = _normalize(external_ids, response.content)
        batch_error = None if usable else "UNACCOUNTED"
        return _outcome(started, results, response, attempts, created=created, batch_error=batch_error)


def _failure_metric(status: int | None) -> str:
    if status is None:
        return "transport_error"
    return "status_5xx" if status >= 500 else f"status_{status}"


def _outcome(
    started: float,
    results: list[RecordWriteResult],
    response: httpx.Response | None,
    attempts: int,
    *,
    status: int | None = None,
    created: frozenset[str] = frozenset(),
    batch_error: str | None = None,
    retry_after: float | None = None,
) -> BatchWriteOutcome:
    return BatchWriteOutcome(
        results=tuple(results),
        created_external_ids=created,
        http_status=response.status_code if response is not None else status,
        duration_ms=round((time.monotonic() - started) * 1000),
        attempts=attempts,
        limit_info=parse_limit_info(response.headers.get("Sforce-Limit-Info")) if response is not None else None,
        batch_error=batch_error,
        retry_after_s=retry_after,
    )


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


def _normalize(external_ids: list[str], content: bytes) -> tuple[list[RecordWriteResult], frozenset[str], bool]:
    """Match UpsertResults to requests by position (the API returns them in request order).
    A body whose positions cannot be trusted leaves every record unaccounted; an unusable
    item leaves only its own record unaccounted. Returns (results, created ids, body usable)."""
    try:
        items = json.loads(content)
    except ValueError:
        return [_unaccounted(x, "response body is not JSON") for x in external_ids], frozenset(), False
    if not isinstance(items, list) or len(items) != len(external_ids):
        why = "response is not a list"
        if isinstance(items, list):
            why = f"response has {len(items)} results for {len(external_ids)} records"
        return [_unaccounted(x, why) for x in external_ids], frozenset(), False
    results, created = [], set()
    for external_id, raw in zip(external_ids, items, strict=True):
        try:
            item = _UpsertItem.model_validate(raw)
        except ValidationError:
            results.append(_unaccounted(external_id, "response has no valid result for this record"))
            continue
        if item.success:
            results.append(RecordWriteResult(external_id, True, item.id, None, None, False))
            if item.created:
                created.add(external_id)
        else:
            first = item.errors[0]
            code = first.statusCode if _IDENTIFIER.match(first.statusCode) else "UNKNOWN_ERROR"
            message = " | ".join(f"{e.statusCode}: {e.message}" for e in item.errors)
            results.append(_failure(external_id, code, message))
    return results, frozenset(created), True
