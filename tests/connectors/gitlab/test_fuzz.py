"""Property-based fuzzing of GitLab payloads and cursor tokens: only typed results, never an
escaped exception, never an issue from a payload that breaks the schema."""

from __future__ import annotations

import json

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_pipelines.connectors.core.executor import RetryExecutor
from nexus_pipelines.connectors.core.values import ExternalIssue, ExternalIssuePage, FetchFailure, FetchIssuePage
from nexus_pipelines.connectors.gitlab.cursor import CursorError, GitLabCursor
from tests.connectors.conformance.suite import _attempt
from tests.connectors.gitlab.harness import PROJECT_ID, GitLabWorld

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)

VALID = {
    "id": 1, "iid": 1, "project_id": PROJECT_ID, "title": "t", "description": "d", "state": "opened",
    "updated_at": "2026-11-01T09:00:00.000Z", "labels": ["a"], "author": {"id": 1, "username": "u", "name": "U"},
    "web_url": "https://gitlab.example.test/acme/platform/-/issues/1", "issue_type": "issue",
}


def issue_like():
    """Valid issues with any one field replaced by arbitrary JSON, dropped, or left valid."""
    return st.builds(
        lambda field, value, drop: {k: v for k, v in {**VALID, **({field: value} if not drop else {})}.items()
                                    if not (drop and k == field)},
        st.sampled_from(sorted(VALID)), json_values, st.booleans())


def adapter_answering(body: bytes, headers=None):
    def handler(request):
        return httpx.Response(200, content=body, headers=headers or {"Date": "Sun, 01 Nov 2026 09:00:00 GMT"})
    return GitLabWorld().adapter(transport=httpx.MockTransport(handler))


def check(result):
    assert isinstance(result, (ExternalIssuePage, FetchFailure)), type(result)
    if isinstance(result, ExternalIssuePage):
        assert all(isinstance(i, ExternalIssue) for i in result.issues)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(issue_like(), max_size=3))
def test_mutated_issue_payloads_give_typed_results_only(items):
    result = RetryExecutor(sleep=lambda s: None).fetch(adapter_answering(json.dumps(items).encode()),
                                                       FetchIssuePage(cursor=None, page_size=10))[0]
    check(result)
    if isinstance(result, ExternalIssuePage):
        for raw, mapped in zip([i for i in items if i.get("issue_type") in ("issue", "incident")], result.issues):
            assert mapped.title == raw["title"] and isinstance(raw["iid"], int)


@settings(max_examples=100, deadline=None)
@given(json_values)
def test_arbitrary_json_bodies_give_typed_results_only(value):
    check(RetryExecutor(sleep=lambda s: None).fetch(adapter_answering(json.dumps(value).encode()),
                                                    FetchIssuePage(cursor=None, page_size=10))[0])


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200), st.text(max_size=80))
def test_garbage_bodies_and_link_headers_give_typed_results_only(body, link):
    adapter = adapter_answering(body, {"Link": link.encode("ascii", "ignore").decode(), "Date": "garbage"})
    check(adapter.fetch_page(FetchIssuePage(cursor=None, page_size=10), _attempt()))


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e), min_size=1, max_size=300))
def test_arbitrary_cursor_tokens_are_typed_failures_or_valid_cursors(token):
    try:
        decoded = GitLabCursor.decode(token)
    except CursorError:
        decoded = None
    result = adapter_answering(b"[]").fetch_page(FetchIssuePage(cursor=token, page_size=5), _attempt())
    check(result)
    assert (decoded is None) == isinstance(result, FetchFailure)
