"""What the providers' fuzz tests share: arbitrary JSON, an adapter whose every request is
answered with one prepared response, and the property every result must have."""

from __future__ import annotations

import httpx
from hypothesis import strategies as st

from nexus_pipelines.connectors.core.executor import RetryExecutor
from nexus_pipelines.connectors.core.values import ExternalIssue, ExternalIssuePage, FetchFailure, FetchIssuePage
from nexus_pipelines.connectors.scan_cursor import CursorError
from tests.connectors.conformance.suite import _attempt

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)


def answering_transport(body: bytes, headers=None, *, answer=None) -> httpx.MockTransport:
    """A transport that answers every request with `body`, except those `answer(request)` answers
    itself (it returns a response, or None to leave the request to `body`): a credential
    exchange, say, that must succeed before the fuzzed request is sent."""
    def handler(request):
        answered = answer(request) if answer is not None else None
        return answered if answered is not None else httpx.Response(
            200, content=body, headers=headers or {"Date": "Sun, 01 Nov 2026 09:00:00 GMT"})
    return httpx.MockTransport(handler)


def adapter_answering(world, body: bytes, headers=None):
    """`world`'s adapter over a transport that answers every request with `body`."""
    return world.adapter(transport=answering_transport(body, headers))


def check(result):
    """A typed page of typed issues, or a typed failure: nothing else may come back."""
    assert isinstance(result, (ExternalIssuePage, FetchFailure)), type(result)
    # the retry executor turns an escaping exception into a contract violation: that is a bug here
    assert not (isinstance(result, FetchFailure) and result.detail.startswith("the adapter raised")), result.detail
    if isinstance(result, ExternalIssuePage):
        assert all(isinstance(i, ExternalIssue) for i in result.issues)


def fetch_checked(adapter, *, retried: bool = True):
    """One first-page fetch (through the retry executor, or one bare invocation), checked."""
    request = FetchIssuePage(cursor=None, page_size=10)
    result = (RetryExecutor(sleep=lambda s: None).fetch(adapter, request)[0] if retried
              else adapter.fetch_page(request, _attempt()))
    check(result)
    return result


# Printable tokens of any shape: what a stored cursor could have been corrupted into.
cursor_text = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e), min_size=1, max_size=300)


def check_cursor_token(token: str, decode, adapter):
    """A token the provider's cursor cannot decode is a typed failure; one it can is a typed page."""
    try:
        decoded = decode(token)
    except CursorError:
        decoded = None
    result = adapter.fetch_page(FetchIssuePage(cursor=token, page_size=5), _attempt())
    check(result)
    assert (decoded is None) == isinstance(result, FetchFailure)
    return result
