"""Property-based fuzzing of GitLab payloads and cursor tokens: only typed results, never an
escaped exception, never an issue from a payload that breaks the schema."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_pipelines.connectors.core.values import ExternalIssuePage
from nexus_pipelines.connectors.gitlab.cursor import GitLabCursor
from tests.connectors.fuzzing import adapter_answering as answering
from tests.connectors.fuzzing import check, check_cursor_token, cursor_text, fetch_checked, json_values
from nexus_pipelines.local.worlds.gitlab import PROJECT_ID, GitLabWorld

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
    return answering(GitLabWorld(), body, headers)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(issue_like(), max_size=3))
def test_mutated_issue_payloads_give_typed_results_only(items):
    result = fetch_checked(adapter_answering(json.dumps(items).encode()))
    if isinstance(result, ExternalIssuePage):
        for raw, mapped in zip([i for i in items if i.get("issue_type") in ("issue", "incident")], result.issues):
            assert mapped.title == raw["title"] and isinstance(raw["iid"], int)


@settings(max_examples=100, deadline=None)
@given(json_values)
def test_arbitrary_json_bodies_give_typed_results_only(value):
    fetch_checked(adapter_answering(json.dumps(value).encode()))


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200), st.text(max_size=80))
def test_garbage_bodies_and_link_headers_give_typed_results_only(body, link):
    adapter = adapter_answering(body, {"Link": link.encode("ascii", "ignore").decode(), "Date": "garbage"})
    fetch_checked(adapter, retried=False)


@settings(max_examples=200, deadline=None)
@given(cursor_text)
def test_arbitrary_cursor_tokens_are_typed_failures_or_valid_cursors(token):
    check_cursor_token(token, GitLabCursor.decode, adapter_answering(b"[]"))