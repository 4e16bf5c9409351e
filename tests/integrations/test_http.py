"""The shared HTTP core: egress guard, no redirects, call counts, timeouts, Retry-After, token auth."""

from __future__ import annotations

import gzip
import json
import logging
import zlib
from datetime import UTC, datetime

import httpx
import pytest

from nexus_pipelines.integrations.http import (
    ENDPOINT,
    BodyTooLarge,
    CallCounter,
    EgressRefused,
    HeaderTokenAuth,
    bounded_timeout,
    make_client,
    origin_of,
    parse_retry_after,
)


def echo(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/moved":
        return httpx.Response(301, headers={"Location": "https://elsewhere.test/x"})
    return httpx.Response(200, json={"path": request.url.path, "auth": request.headers.get("PRIVATE-TOKEN")})


def test_requests_outside_the_configured_origin_are_refused_before_sending():
    sent = []
    transport = httpx.MockTransport(lambda r: sent.append(r) or echo(r))
    with make_client("https://api.example.test", transport=transport) as client:
        assert client.get("/ok").status_code == 200
        with pytest.raises(EgressRefused, match="elsewhere.test"):
            client.get("https://elsewhere.test/steal")
        with pytest.raises(EgressRefused):
            client.get("http://api.example.test/downgraded")  # same host, other scheme: another origin
    assert [r.url.path for r in sent] == ["/ok"]


def test_request_log_lines_keep_the_url_without_its_query_string(caplog):
    caplog.set_level(logging.INFO, logger="httpx")
    with make_client("https://api.example.test", transport=httpx.MockTransport(echo)) as client:
        client.get("/query", params={"q": "SELECT Id FROM X WHERE Key__c IN ('customer-42')"})
    (line,) = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert line.startswith("HTTP Request: GET https://api.example.test/query ") and "customer-42" not in line


def test_redirects_are_returned_never_followed():
    with make_client("https://api.example.test", transport=httpx.MockTransport(echo)) as client:
        response = client.get("/moved")
    assert response.status_code == 301 and response.headers["Location"] == "https://elsewhere.test/x"


def test_calls_are_counted_by_endpoint_and_outcome():
    counter = CallCounter()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/boom":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(429 if request.url.path == "/slow" else 200)

    with make_client("https://api.example.test", transport=httpx.MockTransport(handler), counter=counter) as client:
        client.get("/a", extensions={ENDPOINT: "list"})
        client.get("/slow", extensions={ENDPOINT: "list"})
        with pytest.raises(httpx.ConnectError):
            client.post("/boom")
    assert counter.snapshot() == {"list": 2, "list:status_200": 1, "list:status_429": 1, "POST": 1,
                                  "POST:ConnectError": 1}
    assert counter.total() == 3 and counter.total("list") == 2


def test_token_auth_is_asked_per_request():
    tokens = iter(["token-one-1234", "token-two-5678"])
    auth = HeaderTokenAuth("PRIVATE-TOKEN", lambda: next(tokens))
    with make_client("https://api.example.test", transport=httpx.MockTransport(echo), auth=auth) as client:
        assert [client.get("/x").json()["auth"] for _ in range(2)] == ["token-one-1234", "token-two-5678"]


def test_bounded_timeout_never_exceeds_the_remaining_budget():
    cut = bounded_timeout(1500, httpx.Timeout(connect=5.0, read=30.0, write=1.0, pool=None))
    assert (cut.connect, cut.read, cut.write, cut.pool) == (1.5, 1.5, 1.0, 1.5)
    assert bounded_timeout(0).read == 0.001


def test_origin_makes_default_ports_explicit():
    assert origin_of("https://api.github.com/repos") == "https://api.github.com:443"
    assert origin_of("http://127.0.0.1:8080/x") == "http://127.0.0.1:8080"


def test_retry_after_seconds_and_http_dates():
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("Wed, 01 Jan 2025 12:00:05 GMT", now=now) == 5.0
    assert parse_retry_after("Wed, 01 Jan 2025 11:00:00 GMT", now=now) == 0.0
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
    assert parse_retry_after("\u00b2") is None  # str.isdigit() accepts it, int() does not


def _streamed(chunks, read: list[int]):
    for chunk in chunks:
        read.append(len(chunk))
        yield chunk


def _gzip_of_zeros(mib: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return b"".join(packer.compress(bytes(2**20)) for _ in range(mib)) + packer.flush()


def test_a_streamed_body_past_the_cap_is_stopped_there_and_the_error_names_the_limit():
    read: list[int] = []
    body = (b" " * 65536 for _ in range(64))  # 4 MiB of valid JSON whitespace, no Content-Length
    transport = httpx.MockTransport(lambda r: httpx.Response(200, content=_streamed(body, read)))
    with make_client("https://api.example.test", transport=transport, max_body_bytes=2**20) as client:
        with pytest.raises(BodyTooLarge, match="larger than the 1 MiB a response may hold"):
            client.get("/big", extensions={ENDPOINT: "list_issues"})
    assert sum(read) <= 2**20 + 65536  # reading stopped at the cap, not at 4 MiB


def test_a_declared_length_past_the_cap_is_refused_before_the_body_is_read():
    read: list[int] = []
    transport = httpx.MockTransport(lambda r: httpx.Response(
        200, headers={"Content-Length": str(2**30)}, content=_streamed([b"x"], read)))
    with make_client("https://api.example.test", transport=transport, max_body_bytes=2**20) as client:
        with pytest.raises(BodyTooLarge):
            client.get("/big")
    assert read == []


def test_a_gzip_body_is_decoded_within_the_cap_so_a_small_bomb_never_expands():
    bomb = _gzip_of_zeros(64)  # about 64 KiB that decode to 64 MiB
    assert len(bomb) < 2**20
    read: list[int] = []
    chunks = [bomb[i:i + 4096] for i in range(0, len(bomb), 4096)]
    transport = httpx.MockTransport(lambda r: httpx.Response(200, headers={"Content-Encoding": "gzip"},
                                                             content=_streamed(chunks, read)))
    with make_client("https://api.example.test", transport=transport, max_body_bytes=2**20) as client:
        with pytest.raises(BodyTooLarge):
            client.get("/bomb")
    assert sum(read) < len(bomb)  # stopped while decoding, before the whole bomb arrived


def test_a_gzip_answer_reads_as_its_json_and_only_gzip_is_asked_for():
    payload = {"issues": [{"id": n, "title": "t" * 100} for n in range(200)]}
    packed = gzip.compress(json.dumps(payload).encode())
    asked = []

    def answer(request):
        asked.append(request.headers.get("Accept-Encoding"))
        return httpx.Response(200, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
                              content=iter([packed[:100], packed[100:]]))

    with make_client("https://api.example.test", transport=httpx.MockTransport(answer)) as client:
        assert client.get("/page").json() == payload
    assert asked == ["gzip"]
