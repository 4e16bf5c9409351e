"""Regression tests for the NexusCRM client found in review (simulator in process)."""

from __future__ import annotations

import httpx

from nexus_pipelines.integrations.nexuscrm import NexusCrmClient
from nexus_pipelines.local.simulators.nexuscrm import SimulatorTransport

from .test_nexuscrm_client import KEY, OBJECT, credentials, make_state, rec


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
