"""Property-based fuzzing of Jira payloads, ADF bodies and cursor tokens: only typed results,
never an escaped exception, never an issue from a payload that breaks the schema."""

from __future__ import annotations

import json
from datetime import UTC

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_pipelines.connectors.core.values import ExternalIssuePage, FetchIssuePage
from nexus_pipelines.connectors.jira.adf import AdfError, to_adf, to_text
from nexus_pipelines.connectors.jira.cursor import JiraCursor
from tests.connectors.conformance.suite import _attempt
from tests.connectors.fuzzing import adapter_answering as answering
from tests.connectors.fuzzing import check, check_cursor_token, cursor_text, fetch_checked, json_values
from nexus_pipelines.local.worlds.jira import BOT, PROJECT_ID, JiraWorld

FIELDS = {
    "summary": "s", "description": {"type": "doc", "version": 1, "content": [
        {"type": "paragraph", "content": [{"type": "text", "text": "d"}]}]},
    "labels": ["a"], "reporter": {"accountId": "5b10a2844c20165700ede21g", "displayName": "R"},
    "status": {"id": "10000", "statusCategory": {"key": "new"}}, "updated": "2026-11-01T09:00:00.000+0000",
    "project": {"id": str(PROJECT_ID)}, "issuetype": {"id": "10001", "subtask": False},
}


def issue_like():
    """Valid issues with any one field replaced by arbitrary JSON, dropped, or left valid."""
    def build(name, value, drop):
        fields = {k: v for k, v in {**FIELDS, **({} if drop else {name: value})}.items() if not (drop and k == name)}
        return {"id": "10001", "key": "P10000-1", "fields": fields}
    return st.builds(build, st.sampled_from(sorted(FIELDS)), json_values, st.booleans())


def adapter_answering(body: bytes, headers=None):
    return answering(JiraWorld(), body, headers)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(issue_like(), max_size=3), st.one_of(st.none(), st.text(max_size=40)))
def test_mutated_issue_payloads_give_typed_results_only(items, token):
    body = {"issues": items, **({"nextPageToken": token} if token is not None else {"isLast": True})}
    result = fetch_checked(adapter_answering(json.dumps(body).encode()))
    if isinstance(result, ExternalIssuePage):
        for raw, mapped in zip(items, result.issues):
            assert mapped.title == raw["fields"]["summary"] and raw["fields"]["project"] == {"id": str(PROJECT_ID)}


@settings(max_examples=100, deadline=None)
@given(json_values)
def test_arbitrary_json_bodies_give_typed_results_only(value):
    fetch_checked(adapter_answering(json.dumps(value).encode()))


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200), st.text(max_size=60))
def test_garbage_bodies_and_dates_give_typed_results_only(body, date):
    adapter = adapter_answering(body, {"Date": date.encode("ascii", "ignore").decode()})
    fetch_checked(adapter, retried=False)


@settings(max_examples=200, deadline=None)
@given(cursor_text)
def test_arbitrary_cursor_tokens_are_typed_failures_or_valid_cursors(token):
    check_cursor_token(token, JiraCursor.decode, adapter_answering(b'{"issues": [], "isLast": true}'))

@settings(max_examples=100, deadline=None)
@given(st.datetimes(timezones=st.just(UTC)), st.sampled_from(["Australia/Sydney", "America/Los_Angeles",
                                                              "Pacific/Kiritimati", "Etc/GMT+12"]))
def test_any_cursor_time_in_any_zone_is_a_query_or_a_typed_failure(moment, zone):
    token = JiraCursor(seq=1, since=moment).encode()
    world = JiraWorld()
    world.state.accounts[BOT].time_zone = zone  # the profile's zone, which composition checks
    adapter = world.adapter(world.registration(jql_time_zone=zone),
                            transport=httpx.MockTransport(lambda r: httpx.Response(200, json={"issues": []})))
    check(adapter.fetch_page(FetchIssuePage(cursor=token, page_size=5), _attempt()))


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\r") | st.just("\n"),
               max_size=200))
def test_any_comment_text_reads_back_from_its_adf_exactly(text):
    assert to_text(to_adf(text)) == text


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_arbitrary_adf_is_read_as_text_or_refused_never_raised_otherwise(doc):
    try:
        assert isinstance(to_text({"type": "doc", "version": 1, "content": doc}), str)
    except AdfError:
        pass
