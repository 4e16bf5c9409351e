"""What every provider simulator shares: a plain request/response pair, per-operation
fault injection that covers the transport's failure modes, an in-process httpx
transport and an ASGI app for serving over real HTTP.

A simulator is one function `handle(request) -> SimResponse` over its own state. Tests
use `SimulatorTransport` (sync, no network); the local stack serves `build_app` with
`serve_in_thread`. Transport faults (a refused connection, a reset before or after the
write was applied, a truncated body) exist only in process: over real HTTP a simulator
answers every request it receives.
"""

from __future__ import annotations

import email.utils
import itertools
import json
import re
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


class SimClock:
    """The simulator's wall clock: real time by default, or frozen and advanced by tests."""

    def __init__(self, start: datetime | None = None) -> None:
        self._frozen = start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            moment = self._frozen or datetime.now(UTC)
        return moment.replace(microsecond=moment.microsecond // 1000 * 1000)

    def advance(self, seconds: float) -> None:
        with self._lock:
            if self._frozen is None:
                raise RuntimeError("advance() needs a frozen clock")
            self._frozen += timedelta(seconds=seconds)


@dataclass(frozen=True)
class SimRequest:
    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]  # lower-case names
    body: bytes
    base_url: str

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None

    def form_or_json(self) -> dict[str, Any]:
        """The body as a dict: JSON, or a form (both are accepted by the providers modelled)."""
        if not self.body:
            return {}
        if "application/json" in self.headers.get("content-type", ""):
            data = json.loads(self.body)
            if not isinstance(data, dict):
                raise ValueError("body is not a JSON object")
            return data
        return {k: v[-1] for k, v in parse_qs(self.body.decode(), keep_blank_values=True).items()}


@dataclass
class SimResponse:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    stream: Iterable[bytes] | None = None  # a body sent in chunks as it is produced (then `body` is unused)

    @classmethod
    def json(cls, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> SimResponse:
        return cls(status, json.dumps(payload).encode(), {"content-type": "application/json", **(headers or {})})

    @classmethod
    def text(cls, status: int, text: str, headers: Mapping[str, str] | None = None) -> SimResponse:
        return cls(status, text.encode(), {"content-type": "text/plain", **(headers or {})})


class HugeBody:
    """A JSON body of `size` bytes, `opening` and `closing` padded with whitespace (valid JSON,
    so only a size cap refuses it), streamed in chunks with no Content-Length; `served`
    counts the bytes that left, so a test sees whether the client stopped reading."""

    def __init__(self, size: int, opening: bytes = b"[", closing: bytes = b"]", chunk: int = 64 * 1024) -> None:
        self.size, self.opening, self.closing, self.chunk = size, opening, closing, chunk
        self.served = 0

    def __iter__(self):
        left = self.size - len(self.opening) - len(self.closing)
        self.served += len(self.opening)
        yield self.opening
        while left > 0:
            n = min(self.chunk, left)
            left -= n
            self.served += n
            yield b" " * n
        self.served += len(self.closing)
        yield self.closing


# What a proxy, captive portal or single sign-on gateway answers in place of an API: 200 and a page.
SIGN_IN_PAGE = ("<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body><form method=\"post\" "
                "action=\"/login\"><input name=\"username\"><input name=\"password\" type=\"password\">"
                "</form></body></html>\n")


class TransportFault(Enum):
    CONNECT_ERROR = "connect_error"  # nothing reached the server (httpx.ConnectError)
    CONNECT_TIMEOUT = "connect_timeout"  # nothing reached the server (httpx.ConnectTimeout)
    RESET_BEFORE_RESPONSE = "reset_before_response"  # not applied; the client cannot tell (httpx.ReadError)
    PROTOCOL_ERROR = "protocol_error"  # not applied; a malformed response (httpx.RemoteProtocolError)
    TIMEOUT_BEFORE_APPLY = "timeout_before_apply"  # not applied; read timed out (httpx.ReadTimeout)
    APPLY_THEN_DROP = "apply_then_drop"  # applied, then the connection dropped (httpx.RemoteProtocolError)
    APPLY_THEN_RESET = "apply_then_reset"  # applied, then reset (httpx.ReadError)
    APPLY_THEN_TIMEOUT = "apply_then_timeout"  # applied, then the read timed out (httpx.ReadTimeout)
    TRUNCATED_BODY = "truncated_body"  # applied, then half the body arrived


@dataclass(frozen=True)
class Fault:
    """A transport fault, a status answer that applied nothing (with its headers and body),
    or `after_apply_status`: the request is applied, then that status comes back."""

    transport: TransportFault | None = None
    status: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    body: Any = None
    after_apply_status: int | None = None
    html: str | None = None  # a page (text/html) with `status` (default 200) instead of the API's JSON
    huge_body: HugeBody | None = None  # a 200 whose body is this streamed JSON

    @property
    def applies_first(self) -> bool:
        return self.after_apply_status is not None or self.transport in (
            TransportFault.APPLY_THEN_DROP, TransportFault.APPLY_THEN_RESET, TransportFault.APPLY_THEN_TIMEOUT,
            TransportFault.TRUNCATED_BODY)


class FaultQueue:
    """Faults queued per operation name ('list_issues', 'create_note', ...), consumed in order."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[Fault]] = defaultdict(deque)
        self._lock = threading.Lock()

    def push(self, operation: str, *faults: Fault) -> None:
        with self._lock:
            self._queues[operation].extend(faults)

    def pop(self, operation: str) -> Fault | None:
        with self._lock:
            queue = self._queues.get(operation)
            return queue.popleft() if queue else None

    def clear(self) -> None:
        with self._lock:
            self._queues.clear()


def answer_fault(fault: Fault, apply: Callable[[], SimResponse], default_body: Any) -> SimResponse:
    """How every simulator serves a request with a queued fault: fail before applying, or
    apply and then fail (transport fault, or a status in place of the real answer)."""
    if not fault.applies_first:
        if fault.transport is not None:
            raise InjectedFault(fault.transport)
        if fault.html is not None:
            return SimResponse(fault.status or 200, fault.html.encode(), {"content-type": "text/html; charset=utf-8"})
        if fault.huge_body is not None:
            return SimResponse(fault.status or 200, headers={"content-type": "application/json"},
                               stream=fault.huge_body)
        body = default_body if fault.body is None else fault.body
        return SimResponse.json(fault.status or 500, body, fault.headers)
    response = apply()
    if fault.after_apply_status is not None:
        return SimResponse.json(fault.after_apply_status, default_body, fault.headers)
    raise InjectedFault(fault.transport, response)


class InjectedFault(Exception):
    """Raised inside a simulator's handler to turn a prepared response into a transport fault."""

    def __init__(self, fault: TransportFault, response: SimResponse | None = None) -> None:
        super().__init__(fault.value)
        self.fault = fault
        self.response = response


class SimulatorState:
    """What every provider's state shares: ids from one counter, and its data kept in a JSON
    file across restarts (the local stack's, like a real tracker's). A subclass has `_lock`
    and `_ids` (an `itertools.count`) and gives `_records()` (its data as JSON-ready dicts)
    and `_restore(data)` (what `_records` gave)."""

    def next_id(self) -> int:
        return next(self._ids)

    def save(self, path: Path) -> None:
        with self._lock:
            data = {**self._records(), "next_id": next(self._ids)}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, default=str))

    def load(self, path: Path) -> bool:
        """Restore what `save` wrote; False before the first save."""
        if not path.exists():
            return False
        data = json.loads(path.read_text())
        with self._lock:
            self._restore(data)
            self._ids = itertools.count(data["next_id"])
        return True


def parse_time(value: str) -> datetime | None:
    """An ISO 8601 query time (`Z` for UTC; a naive one is UTC), or None for one that is not."""
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def positive(value: str | None, *, default: int) -> int | None:
    """A page or page size query value: `default` when absent or empty, None unless a whole number above 0."""
    if value is None or value == "":
        return default
    return int(value) if value.isdigit() and int(value) > 0 else None


Routes = tuple[tuple[re.Pattern[str], Mapping[str, str]], ...]  # path pattern, method -> operation


def find_route(routes: Routes, request: SimRequest) -> tuple[str, re.Match[str] | None]:
    """The operation a request names and its path match: `method_not_allowed` for a known path
    without that method, `not_found` (no match) for an unknown path."""
    for pattern, operations in routes:
        match = pattern.match(request.path)
        if match:
            return operations.get(request.method, "method_not_allowed"), match
    return "not_found", None


class Simulator:
    """What every provider's handler shares: count the routed operation, answer its queued
    fault or the request itself, and stamp the state clock's `Date` on the answer.

    A subclass gives a static `route(request) -> (operation, groups)` (`find_route` over its
    route table), an `_answer(request, operation, groups)` and `fault_body`, the provider's
    body for a status fault; its state has `_lock`, `calls`, `faults` and `clock`."""

    fault_body: Any = None

    def __init__(self, state: Any) -> None:
        self.state = state

    def __call__(self, request: SimRequest) -> SimResponse:
        return self.handle(request)

    def handle(self, request: SimRequest) -> SimResponse:
        operation, groups = self.route(request)
        with self.state._lock:
            self.state.calls[operation] += 1
        fault = self.state.faults.pop(operation)
        if fault is None:
            return self._dated(self._answer(request, operation, groups))
        return self._dated(answer_fault(fault, lambda: self._dated(self._answer(request, operation, groups)),
                                        self.fault_body))

    def _dated(self, response: SimResponse) -> SimResponse:
        response.headers.setdefault("Date", email.utils.format_datetime(self.state.clock.now(), usegmt=True))
        return response


def _raise(fault: TransportFault, request: httpx.Request, response: SimResponse | None) -> httpx.Response:
    message = f"simulated {fault.value}"
    if fault is TransportFault.CONNECT_ERROR:
        raise httpx.ConnectError(message, request=request)
    if fault is TransportFault.CONNECT_TIMEOUT:
        raise httpx.ConnectTimeout(message, request=request)
    if fault in (TransportFault.RESET_BEFORE_RESPONSE, TransportFault.APPLY_THEN_RESET):
        raise httpx.ReadError(message, request=request)
    if fault in (TransportFault.TIMEOUT_BEFORE_APPLY, TransportFault.APPLY_THEN_TIMEOUT):
        raise httpx.ReadTimeout(message, request=request)
    if fault in (TransportFault.APPLY_THEN_DROP, TransportFault.PROTOCOL_ERROR):
        raise httpx.RemoteProtocolError(message, request=request)
    assert response is not None
    return httpx.Response(response.status, headers=response.headers, content=response.body[: len(response.body) // 2],
                          request=request)


Handler = Callable[[SimRequest], SimResponse]


def to_sim_request(request: httpx.Request) -> SimRequest:
    return SimRequest(
        method=request.method,
        path=request.url.path,
        query=parse_qs(request.url.query.decode(), keep_blank_values=True),
        headers={k.lower(): v for k, v in request.headers.items()},
        body=request.read(),
        base_url=f"{request.url.scheme}://{request.url.netloc.decode('ascii')}",
    )


class SimulatorTransport(httpx.BaseTransport):
    """Sync in-process transport over a simulator's handler (httpx's ASGI transport is async-only)."""

    def __init__(self, handle: Handler) -> None:
        self._handle = handle
        self.requests: list[httpx.Request] = []
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            self.requests.append(request)
        try:
            sim = self._handle(to_sim_request(request))
        except InjectedFault as injected:
            return _raise(injected.fault, request, injected.response)
        content = iter(sim.stream) if sim.stream is not None else sim.body  # an iterator stays unread
        return httpx.Response(sim.status, headers=sim.headers, content=content, request=request)


def build_app(handle: Handler) -> Starlette:
    async def endpoint(request: Request) -> Response:
        sim_request = SimRequest(
            method=request.method,
            path=request.url.path,
            query=parse_qs(request.url.query, keep_blank_values=True),
            headers={k.lower(): v for k, v in request.headers.items()},
            body=await request.body(),
            base_url=str(request.base_url).rstrip("/"),
        )
        try:
            sim = await run_in_threadpool(handle, sim_request)
        except InjectedFault as injected:  # no transport faults over real HTTP: answer what was prepared
            sim = injected.response or SimResponse.text(503, "simulated fault")
        if sim.stream is not None:
            return StreamingResponse(iter(sim.stream), status_code=sim.status, headers=sim.headers)
        return Response(sim.body, status_code=sim.status, headers=sim.headers)

    methods = ["GET", "POST", "PATCH", "PUT", "DELETE"]
    return Starlette(routes=[Route("/{path:path}", endpoint, methods=methods)])


def serve_in_thread(app: Any, port: int = 0, *, startup_timeout_s: float = 10.0) -> tuple[str, Callable[[], None]]:
    """Serve an ASGI app on 127.0.0.1 from a daemon thread; returns (base URL, stop)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"cannot serve a simulator on 127.0.0.1:{port}: {exc.strerror}") from None
    bound_port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{bound_port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError(f"simulator server on 127.0.0.1:{bound_port} did not start")
        time.sleep(0.01)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()

    return f"http://127.0.0.1:{bound_port}", stop
