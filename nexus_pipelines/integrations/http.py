"""The HTTP core every provider client is built on.

`make_client` gives one pooled `httpx.Client` with explicit timeouts, redirects never
followed, an egress guard (a request to any origin but the configured ones is refused
before it leaves the process), a cap on each response body's size (read as a stream and
stopped at the cap, so a runaway answer is never held in memory whole) and call counting
per endpoint and outcome; httpx's request log lines show each URL without its query string.
Transports are injectable, so tests run the project's simulators in process. Nothing here
retries: retry policy belongs to the caller (the CRM client's retry loop, the
connector core's executor).
"""

from __future__ import annotations

import email.utils
import logging
import threading
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Protocol

import httpx

ENDPOINT = "nexus_endpoint"  # request extension naming the endpoint, for call counts
DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=30.0, write=30.0, pool=5.0)
DEFAULT_LIMITS = httpx.Limits(max_connections=4, max_keepalive_connections=4)


# The largest response body a client reads (a page of 100 issues with long descriptions
# fits many times over); a larger one is refused, never parsed.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
# gzip only: the capped stream decodes it within the cap (httpx would also offer br and zstd).
ACCEPT_ENCODING = {"Accept-Encoding": "gzip"}


class EgressRefused(httpx.TransportError):
    """A request named an origin this client may not call; nothing was sent."""


class GateClosed(httpx.TransportError):
    """The provider's stated wait is in force for this request's gate; nothing was sent."""

    def __init__(self, message: str, *, wait_s: float, request: httpx.Request) -> None:
        super().__init__(message, request=request)
        self.wait_s = wait_s


class RequestGate(Protocol):
    """Asked before a request goes out (`admit` raises GateClosed to hold it) and told every answer."""

    def admit(self, request: httpx.Request) -> None: ...

    def observe(self, response: httpx.Response) -> None: ...
class BodyTooLarge(httpx.DecodingError):
    """A response body passed the client's size cap; reading stopped there."""

    def __init__(self, endpoint: str, limit: int, *, request: httpx.Request) -> None:
        size = f"{limit // 2**20} MiB" if limit % 2**20 == 0 else f"{limit} bytes"
        super().__init__(f"{endpoint}: the response body is larger than the {size} a response may hold; reading "
                         "stopped there (ask for smaller pages)", request=request)
        self.limit = limit


class _CappedStream(httpx.SyncByteStream):
    """The body, stopped with `BodyTooLarge` as soon as it passes `limit` bytes. A gzip body
    is decoded here, never to more than the limit (a small compressed body can expand to
    gigabytes), so the response reaches httpx as identity."""

    def __init__(self, inner: httpx.SyncByteStream, limit: int, endpoint: str, request: httpx.Request, *,
                 gzipped: bool) -> None:
        self._inner, self._limit, self._endpoint, self._request = inner, limit, endpoint, request
        self._gzipped = gzipped

    def __iter__(self):
        decoder = zlib.decompressobj(16 + zlib.MAX_WBITS) if self._gzipped else None
        seen = 0
        for chunk in self._inner:
            if decoder is not None:
                try:
                    chunk = decoder.decompress(chunk, self._limit + 1 - seen)  # never more than the cap allows
                except zlib.error as exc:
                    raise httpx.DecodingError(f"{self._endpoint}: the gzip body does not decode ({exc})",
                                              request=self._request) from None
            yield self._counted(chunk, seen)
            seen += len(chunk)
        if decoder is not None:
            rest = decoder.flush()
            yield self._counted(rest, seen)

    def _counted(self, chunk: bytes, seen: int) -> bytes:
        if seen + len(chunk) > self._limit:
            raise BodyTooLarge(self._endpoint, self._limit, request=self._request)
        return chunk

    def close(self) -> None:
        self._inner.close()


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def check_service_url(url: str, *, local_mode: bool) -> str:
    """An absolute https URL with no credentials, query or fragment; plain http only to a
    loopback host in local mode (the simulators). Returns it without a trailing slash."""
    parsed = httpx.URL(url)
    if parsed.scheme not in ("https", "http") or not parsed.host:
        raise ValueError("must be an absolute http(s) URL")
    if parsed.userinfo or parsed.query or parsed.fragment:
        raise ValueError("must not carry credentials, a query or a fragment")
    if parsed.scheme == "http" and not (local_mode and parsed.host in LOOPBACK_HOSTS):
        raise ValueError("must use https (plain http only to a loopback host with local_mode: true)")
    return url.rstrip("/")


def origin_of(url: str | httpx.URL) -> str:
    """`scheme://host:port` with the default port made explicit."""
    url = httpx.URL(url)
    port = url.port or {"https": 443, "http": 80}.get(url.scheme)
    return f"{url.scheme}://{url.host}:{port}"


class CallCounter:
    """Thread-safe counts of `endpoint` and `endpoint:outcome` (status_NNN or an exception name)."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, endpoint: str, outcome: str) -> None:
        with self._lock:
            self._counts[endpoint] += 1
            self._counts[f"{endpoint}:{outcome}"] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def total(self, endpoint: str | None = None) -> int:
        with self._lock:
            if endpoint is not None:
                return self._counts[endpoint]
            return sum(v for k, v in self._counts.items() if ":" not in k)


class GuardedTransport(httpx.BaseTransport):
    """Refuses origins outside the allow-list, asks the gate (if any), and counts every
    request that goes out; a request the gate holds is not counted, since it never left."""

    def __init__(self, inner: httpx.BaseTransport, allowed_origins: Iterable[str], counter: CallCounter,
                 gate: RequestGate | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self._inner = inner
        self._allowed = frozenset(origin_of(o) for o in allowed_origins)
        self._counter = counter
        self._gate = gate
        self._max_body = max_body_bytes

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        origin = origin_of(request.url)
        if origin not in self._allowed:
            raise EgressRefused(f"refused a request to {origin}: this client may only call "
                                f"{', '.join(sorted(self._allowed))}", request=request)
        if self._gate is not None:
            self._gate.admit(request)
        endpoint = str(request.extensions.get(ENDPOINT) or request.method)
        try:
            response = self._inner.handle_request(request)
        except Exception as exc:
            self._counter.add(endpoint, type(exc).__name__)
            raise
        self._counter.add(endpoint, f"status_{response.status_code}")
        if self._gate is not None:
            self._gate.observe(response)
        return self._capped(response, endpoint, request)

    def _capped(self, response: httpx.Response, endpoint: str, request: httpx.Request) -> httpx.Response:
        """The response with its body held to the cap: refused at once by its Content-Length
        (or by a body already in memory), else stopped while it streams."""
        try:
            held = len(response.content)  # an in-process transport answers with the body read
        except httpx.ResponseNotRead:
            held = None
        declared = response.headers.get("Content-Length", "")
        if (held or 0) > self._max_body or (declared.isascii() and declared.isdigit()
                                            and int(declared) > self._max_body):
            response.close()
            raise BodyTooLarge(endpoint, self._max_body, request=request)
        if held is None:
            encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("identity", "gzip"):  # only gzip is asked for (ACCEPT_ENCODING)
                response.close()
                raise httpx.DecodingError(f"{endpoint}: the body came with Content-Encoding {encoding!r}, "
                                          "which was not asked for", request=request)
            response.headers.pop("Content-Encoding", None)  # decoded by the capped stream
            response.stream = _CappedStream(response.stream, self._max_body, endpoint, request,
                                            gzipped=encoding == "gzip")
        return response

    def close(self) -> None:
        self._inner.close()


class _WithoutQuery(logging.Filter):
    """httpx logs each request's URL at INFO. A query string carries what the call looks
    for (a SOQL list of external ids, search terms, a token a provider takes as a
    parameter), so the line keeps the URL without it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(a.copy_with(query=None) if isinstance(a, httpx.URL) and a.query else a
                                for a in record.args)
        return True


logging.getLogger("httpx").addFilter(_WithoutQuery())


def make_client(
    base_url: str,
    *,
    transport: httpx.BaseTransport | None = None,
    allowed_origins: Iterable[str] = (),
    counter: CallCounter | None = None,
    auth: httpx.Auth | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: httpx.Timeout = DEFAULT_TIMEOUT,
    limits: httpx.Limits = DEFAULT_LIMITS,
    gate: RequestGate | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> httpx.Client:
    """A client that may call `base_url`'s origin (and `allowed_origins`) and nothing else,
    each request first admitted by `gate` when one is given."""
    inner = transport if transport is not None else httpx.HTTPTransport(limits=limits)
    guarded = GuardedTransport(inner, [base_url, *allowed_origins], counter or CallCounter(), gate, max_body_bytes)
    return httpx.Client(
        base_url=base_url, transport=guarded, auth=auth, headers={**ACCEPT_ENCODING, **(headers or {})},
        timeout=timeout, follow_redirects=False,
    )


def bounded_timeout(remaining_ms: int, base: httpx.Timeout = DEFAULT_TIMEOUT) -> httpx.Timeout:
    """`base` with every phase cut to the remaining budget (an invocation's deadline)."""
    cap = max(remaining_ms, 1) / 1000.0

    def cut(value: float | None) -> float:
        return cap if value is None else min(value, cap)

    return httpx.Timeout(connect=cut(base.connect), read=cut(base.read), write=cut(base.write), pool=cut(base.pool))


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP date); None if absent or bad."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # "²".isdigit() is true
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


class HeaderTokenAuth(httpx.Auth):
    """Puts a token into one header on every request: `PRIVATE-TOKEN: <t>`, or with a
    scheme `Authorization: Bearer <t>`. `token` is called per request, so a provider of
    short-lived tokens (a GitHub installation token cache) refreshes behind it."""

    def __init__(self, header: str, token, scheme: str | None = None) -> None:
        self._header = header
        self._token = token
        self._scheme = scheme

    def auth_flow(self, request: httpx.Request):
        value = self._token()
        request.headers[self._header] = f"{self._scheme} {value}" if self._scheme else value
        yield request
