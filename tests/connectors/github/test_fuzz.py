"""Property-based fuzzing of GitHub listings, headers and cursor tokens: only typed results,
never an escaped exception, never an issue from a payload that breaks the schema, never a
pull request mapped.

Every request, composition's included, goes through one answering transport: the App JWT
exchange (`POST /app/installations/{id}/access_tokens`) is answered by the world's
simulator, so the token is a real one (a mint after a fuzzed `Date` moved GitHub's clock
signs a JWT the simulator refuses: a typed failure too); every other request gets the
fuzzed answer."""

from __future__ import annotations

import email.utils
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nexus_pipelines.connectors.core.compose import compose
from nexus_pipelines.connectors.core.registry import ComposeContext
from nexus_pipelines.connectors.core.values import ExternalIssuePage
from nexus_pipelines.connectors.github.cursor import GitHubCursor
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.connectors.scan_cursor import NONE
from nexus_pipelines.local.simulators.github import Issue, Repository, User, issue_payload
from tests.connectors.fuzzing import answering_transport, check, check_cursor_token, cursor_text, fetch_checked, json_values
from nexus_pipelines.local.worlds.github import API_URL, REPOSITORY_ID, GitHubWorld
from nexus_pipelines.local.worlds.github_keys import short_key_pair

# every example composes an adapter, so signs an App JWT: a short key keeps the module fast
pytestmark = pytest.mark.filterwarnings("ignore::jwt.InsecureKeyLengthWarning")

_AT = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
_REPO = Repository(REPOSITORY_ID, "acme", f"platform-{REPOSITORY_ID}")
VALID = issue_payload(Issue(id=1001, number=1, title="t", body="d", user=User(7, "u"), labels=["a"],
                            created_at=_AT, updated_at=_AT), _REPO, API_URL)
PULL = issue_payload(Issue(id=1002, number=2, title="p", body="d", user=User(7, "u"), labels=[],
                           created_at=_AT, updated_at=_AT, is_pull_request=True), _REPO, API_URL)["pull_request"]
MAPPED = ("number", "updated_at", "id", "title", "body", "state", "labels", "user", "html_url", "pull_request")


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _time(value) -> bool:
    if not isinstance(value, str):
        return False
    try:
        return datetime.fromisoformat(value).tzinfo is not None
    except ValueError:
        return False


def is_issue(raw: dict) -> bool:
    """GitHub's issue schema for what the adapter maps, judged apart from the adapter's models."""
    user, labels = raw.get("user", ...), raw.get("labels")
    return ("pull_request" not in raw and _int(raw.get("number")) and raw["number"] > 0 and _int(raw.get("id"))
            and _time(raw.get("updated_at")) and isinstance(raw.get("title"), str)
            and "body" in raw and (raw["body"] is None or isinstance(raw["body"], str))
            and raw.get("state") in ("open", "closed") and isinstance(raw.get("html_url"), str)
            and (user is None or isinstance(user, dict) and _int(user.get("id")) and isinstance(user.get("login"), str))
            and isinstance(labels, list) and all(isinstance(label, str) or isinstance(label, dict)
                                                 and isinstance(label.get("name"), str) and label["name"]
                                                 for label in labels))


_ZONE = st.builds(timezone, st.integers(-1439, 1439).map(lambda m: timedelta(minutes=m)))
# any zoned moment, often within a day of either end of datetime's range
_MOMENT = (st.datetimes(timezones=_ZONE) | st.datetimes(max_value=datetime(1, 1, 2), timezones=_ZONE)
           | st.datetimes(min_value=datetime(9999, 12, 31), timezones=_ZONE))
# what lax parsing would take for a time or a number: ISO text in any zone or none, digits
_TIME_LIKE = (_MOMENT | st.datetimes()).map(datetime.isoformat) | st.integers(min_value=0, max_value=2**40).map(str)


def issue_like():
    """Simulator-rendered items, issues or pull requests, with any one field replaced by
    arbitrary JSON, dropped, or left valid (the mapped fields are chosen half the time)."""
    def build(pull, field, value, how):
        item = {**VALID, **({"pull_request": PULL} if pull else {})}
        if how == "replace":
            item[field] = value
        elif how == "drop":
            item.pop(field, None)
        return item
    return st.builds(build, st.booleans(), st.sampled_from(MAPPED) | st.sampled_from(sorted(VALID)),
                     json_values | _TIME_LIKE, st.sampled_from(["replace", "drop", "keep"]))


def fetched(adapter, *, retried: bool = True):
    """`fetch_checked`, and a page's next cursor is one this adapter reads back."""
    result = fetch_checked(adapter, retried=retried)
    if isinstance(result, ExternalIssuePage):
        GitHubCursor.decode(result.next_cursor)
    return result


def adapter_answering(body: bytes, headers=None):
    world = GitHubWorld(key_pair=short_key_pair())

    def mint(request):  # the token exchange, answered as the simulator answers it
        return world.transport.handle_request(request) if request.url.path.endswith("/access_tokens") else None

    return compose(world.registration(), REGISTRY,
                   ComposeContext(transport=answering_transport(body, headers, answer=mint)), environ=world.environ)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(issue_like(), max_size=3))
def test_mutated_issue_payloads_give_typed_results_only(items):
    result = fetched(adapter_answering(json.dumps(items).encode()))
    if isinstance(result, ExternalIssuePage):
        issues = [i for i in items if "pull_request" not in i]
        assert len(result.issues) == len(issues) and result.excluded == len(items) - len(issues)
        for raw, mapped in zip(issues, result.issues):
            assert is_issue(raw), raw
            assert mapped.title == raw["title"] and mapped.external_ref == f"github:{REPOSITORY_ID}:{raw['number']}"


@settings(max_examples=100, deadline=None)
@given(json_values)
def test_arbitrary_json_bodies_give_typed_results_only(value):
    fetched(adapter_answering(json.dumps(value).encode()))


# header values as latin-1 text (what httpx decodes bytes beyond ASCII as), garbage or nearly right
_GARBAGE = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xff), max_size=60)
_NUMBERISH = (_GARBAGE | st.sampled_from(["0", "-1", "5000", "²"]) | st.integers(-2, 10**12).map(str)
              | st.text(alphabet="0123456789", min_size=300, max_size=400))
_HEADERS = st.fixed_dictionaries({
    "Link": _GARBAGE | st.builds('<{}>; rel="next"'.format, _GARBAGE | st.builds(f"{API_URL}/{{}}".format, _GARBAGE)),
    "Date": _GARBAGE | _MOMENT.map(email.utils.format_datetime),
    "ETag": _GARBAGE | st.builds('W/"{}"'.format, _GARBAGE),
    **{f"x-ratelimit-{name}": _NUMBERISH for name in ("remaining", "reset", "limit", "used")},
})
# garbage, or a listing the adapter reads, so the headers are read too
_BODY = st.binary(max_size=200) | st.sampled_from([b"[]", json.dumps([VALID]).encode()])


@settings(max_examples=100, deadline=None)
@given(_BODY, _HEADERS)
# a Date 8,000 years ahead with a spent budget, then a token re-signed on GitHub's corrected clock:
# the gate's end lay past any calendar and stating it raised ValueError
@example(body=b"", headers={"Link": "", "Date": "31 DEC 9999 0:0", "ETag": "", "x-ratelimit-remaining": "0",
                            "x-ratelimit-reset": "1000000000000", "x-ratelimit-limit": "", "x-ratelimit-used": ""})
def test_garbage_bodies_and_headers_give_typed_results_only(body, headers):
    """And the invocation after it too: the rate gate and GitHub's clock keep what they saw."""
    adapter = adapter_answering(body, {k: v.encode("latin-1") for k, v in headers.items()})
    fetched(adapter, retried=False)
    fetched(adapter, retried=False)


_PRINTABLE = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e), min_size=1, max_size=60)
_CURSOR_TIME = st.just(NONE) | _MOMENT.map(datetime.isoformat)  # garbage times: the arbitrary tokens
_CURSOR_LIKE = st.builds("gh1;n={};since={};from={};hwm={};etag={};next={}".format,
                         st.integers(min_value=0, max_value=10**13) | _PRINTABLE, _CURSOR_TIME, _CURSOR_TIME,
                         _CURSOR_TIME, st.just(NONE) | _PRINTABLE, st.just(NONE) | _PRINTABLE.map("/{}".format)
                         | _PRINTABLE)


@settings(max_examples=200, deadline=None)
@given(cursor_text
       | _CURSOR_LIKE)
def test_arbitrary_cursor_tokens_are_typed_failures_or_valid_cursors(token):
    check_cursor_token(token, GitHubCursor.decode, adapter_answering(b"[]"))