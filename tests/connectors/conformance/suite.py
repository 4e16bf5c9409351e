"""The shared connector conformance suite: the admission contract for every connector
(docs/design/connector-contract.md, "Conformance").

A provider binds itself with `from tests.connectors.conformance.suite import *` in its own
`test_conformance.py` and a `world` fixture returning its `World` (see `harness.py`).
No row here may be weakened, replaced or skipped for a provider: fetch, mapping, cursor,
retry classification (timeout, throttling, 5xx, the three transport rows), terminal
failures, attempt and deadline bounds, capped deterministic jitter, one transport
operation per invocation, and the three ambiguous-write outcomes.
"""

from __future__ import annotations

import httpx
import pytest

from nexus_pipelines.connectors.core.closeback import close_comment, command_id, marker
from nexus_pipelines.connectors.core.executor import DELAY_CAP_S, JITTER_FRACTION, RetryExecutor, capped_delay
from nexus_pipelines.connectors.core.values import (
    CURSOR_MAX_CHARS,
    DEADLINE_MS,
    MAX_ATTEMPTS,
    AmbiguousWrite,
    CloseExternalIssue,
    CloseFailure,
    ConnectorReceipt,
    ExternalIssue,
    ExternalIssuePage,
    FetchFailure,
    FetchIssuePage,
)
from nexus_pipelines.integrations.http import DEFAULT_MAX_BODY_BYTES
from nexus_pipelines.local.simulators.http import SIGN_IN_PAGE, Fault, HugeBody
from nexus_pipelines.local.worlds import scans


class FakeClock:
    """Monotonic time that only moves when the executor sleeps or a request 'takes' time."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


class SlowTransport(httpx.BaseTransport):
    """Every request takes `seconds` of the fake clock (the adapter's own timeouts use real time)."""

    def __init__(self, inner: httpx.BaseTransport, clock: FakeClock, seconds: float) -> None:
        self.inner, self.clock, self.seconds = inner, clock, seconds
        self.started_at: list[float] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.started_at.append(self.clock.now)
        self.clock.now += self.seconds
        return self.inner.handle_request(request)


def executor(clock: FakeClock | None = None, jitter: float = 0.0) -> RetryExecutor:
    clock = clock or FakeClock()
    return RetryExecutor(clock=clock, sleep=clock.sleep, jitter=lambda: jitter)


def scan(world, adapter, *, page_size: int = 100, cursor: str | None = None, max_pages: int = 500):
    """Fetch until the scan is exhausted; returns (issues in order, tokens)."""
    return scans.scan(adapter, page_size=page_size, cursor=cursor, max_pages=max_pages)


def close_command(ref: str, ticket: int = 1, proof: int = 1, *, reconcile_first: bool = False) -> CloseExternalIssue:
    cid = command_id("acme", ticket, proof)
    return CloseExternalIssue(external_ref=ref, command_id=cid, marker=marker(cid), reconcile_first=reconcile_first,
                              comment=close_comment(ticket_id=ticket, proof_id=proof, evidence="released in 4.2",
                                                    recorded_by="operator", command=cid))


def writes(world, operation: str) -> int:
    return sum(1 for op, _ in world.requests() if op == operation)


# -- fetch, mapping, cursor ----------------------------------------------------------------


def test_fetch_maps_every_issue_exactly_once_with_its_exact_identity(world):
    refs = world.add_issues(7)
    issues, _ = scan(world, world.adapter())
    assert [i.external_ref for i in issues] == refs
    first = issues[0]
    assert isinstance(first, ExternalIssue) and first.connector_kind == world.kind
    assert first.external_ref.startswith(f"{world.kind}:") and first.title and first.display_url.startswith("http")
    assert first.external_state == "open" and first.external_updated_at.tzinfo is not None


def test_pages_respect_the_core_bound_and_walk_the_whole_container(world):
    refs = world.add_issues(25)
    issues, tokens = scan(world, world.adapter(), page_size=10)
    assert [i.external_ref for i in issues] == refs
    assert len(tokens) - 1 <= 4  # ceil(25 / 10) pages, plus at most one final page


def test_ties_across_page_boundaries_are_all_delivered_once(world):
    refs = world.add_issues(45, same_updated_at=True)
    issues, _ = scan(world, world.adapter(), page_size=10)
    assert sorted(i.external_ref for i in issues) == sorted(refs)
    assert len(issues) == len(refs)


def test_an_issue_updated_mid_scan_is_not_missed(world):
    adapter = world.adapter()
    # a minute apart: with issues a millisecond apart the next scan's one-second overlap
    # re-reads whatever an offset page skipped, and the row could not fail
    refs = []
    for _ in range(30):
        refs += world.add_issues(1)
        world.advance(60)
    first, _ = executor().fetch(adapter, FetchIssuePage(cursor=None, page_size=10))
    world.update_issue(refs[2], title="moved to the end by an update")  # already read: the others shift
    issues, _ = scan(world, adapter, page_size=10, cursor=first.next_cursor)
    seen = {i.external_ref for i in first.issues} | {i.external_ref for i in issues}
    assert seen == set(refs)
    latest, _ = scan(world, adapter, page_size=10, cursor=_last(world, adapter, first.next_cursor))
    assert any(i.external_ref == refs[2] and i.title == "moved to the end by an update" for i in issues + latest)


def _last(world, adapter, cursor):
    _, tokens = scan(world, adapter, page_size=10, cursor=cursor)
    return tokens[-1]


def test_an_unchanged_rescan_reads_only_the_overlap(world):
    world.add_issues(12)
    adapter = world.adapter()
    _, tokens = scan(world, adapter, page_size=5)
    world.advance(120)
    again, _ = scan(world, adapter, page_size=5, cursor=tokens[-1])
    assert len(again) <= 12  # overlap is allowed (and deduplicated downstream), a full re-read is not required


def test_excluded_items_are_skipped_while_the_cursor_advances(world):
    refs = world.add_issues(3)
    world.add_excluded_item()
    more = world.add_issues(2)
    issues, tokens = scan(world, world.adapter(), page_size=2)
    assert [i.external_ref for i in issues] == refs + more
    assert len(set(tokens[1:])) == len(tokens) - 1


def test_cursor_tokens_advance_are_bounded_printable_and_hold_no_secret(world):
    world.add_issues(9)
    _, tokens = scan(world, world.adapter(), page_size=4)
    produced = tokens[1:]
    assert len(set(produced)) == len(produced)  # every page advances the token
    for token in produced:
        assert 0 < len(token) <= CURSOR_MAX_CHARS and token.isprintable() and " " not in token
        assert not any(secret in token for secret in world.secret_values)


def test_a_corrupted_cursor_is_a_typed_terminal_failure(world):
    result, log = executor().fetch(world.adapter(), FetchIssuePage(cursor="not-this-connectors-token", page_size=10))
    assert isinstance(result, FetchFailure) and result.retry_class == "terminal" and log.attempts == 1


# -- retry classification ------------------------------------------------------------------

RETRYABLE_FETCH = [
    ("timeout", "timeout"),
    ("throttled", "throttled"),
    ("provider_5xx", "provider_5xx"),
    ("connect_error", "transport_connect"),
    ("read_error", "transport_read"),
    ("protocol_error", "transport_protocol"),
]


@pytest.mark.parametrize("fault, reason", RETRYABLE_FETCH)
def test_a_transient_fetch_failure_is_retried_and_recovers(world, fault, reason):
    refs = world.add_issues(3)
    world.fail_next("list", fault)
    result, log = executor().fetch(world.adapter(), FetchIssuePage(cursor=None, page_size=10))
    assert isinstance(result, ExternalIssuePage) and [i.external_ref for i in result.issues] == refs
    assert log.results == [f"fetch_failure:{reason}", "page"] and log.attempts == 2


@pytest.mark.parametrize("fault, reason", RETRYABLE_FETCH)
def test_a_persistent_fetch_failure_stops_at_four_attempts(world, fault, reason):
    world.add_issues(1)
    world.fail_next("list", fault, times=MAX_ATTEMPTS + 2)
    result, log = executor().fetch(world.adapter(), FetchIssuePage(cursor=None, page_size=10))
    assert isinstance(result, FetchFailure) and (result.retry_class, result.reason) == ("retryable", reason)
    assert log.attempts == MAX_ATTEMPTS and writes(world, "list") == MAX_ATTEMPTS  # no fifth attempt


def _first_transport_row(world, fault, reason, applied_fault):
    refs = world.add_issues(2)
    world.fail_next("list", fault)
    result, log = executor().fetch(world.adapter(), FetchIssuePage(cursor=None, page_size=10))
    assert log.results[0] == f"fetch_failure:{reason}" and isinstance(result, ExternalIssuePage)
    # close: a request that may have been written is reconciled before anything retryable comes back
    world.clear_requests()
    world.fail_next("comment", applied_fault)
    command = close_command(refs[0])
    first = world.adapter().comment_and_close(command, _attempt())
    ops = [op for op, _ in world.requests()]
    assert "lookup" in ops[ops.index("comment"):], ops
    assert isinstance(first, ConnectorReceipt)  # the write had been applied: the marker proves it
    assert sum(command.marker in c for c in world.comments(refs[0])) == 1
    world.clear_requests()
    world.fail_next("comment", fault)
    second = executor().close(world.adapter(), close_command(refs[1], ticket=2))
    assert isinstance(second[0], ConnectorReceipt), second
    assert second[1].results[0] == f"close_failure:{reason}"
    assert sum(1 for c in world.comments(refs[1]) if "[nexus:close:" in c) == 1
    return second


def _attempt():
    from nexus_pipelines.connectors.core.values import ConnectorAttempt

    return ConnectorAttempt(attempt_number=1, deadline_remaining_milliseconds=DEADLINE_MS)


def test_the_retry_classifies_a_connect_error_and_a_refused_close_writes_once(world):
    refs = world.add_issues(2)
    world.fail_next("list", "connect_error")
    result, log = executor().fetch(world.adapter(), FetchIssuePage(cursor=None, page_size=10))
    assert log.results[0] == "fetch_failure:transport_connect" and isinstance(result, ExternalIssuePage)
    # close: a refused connection wrote nothing, so it may come back retryable with not_written ...
    world.fail_next("comment", "connect_error")
    first = world.adapter().comment_and_close(close_command(refs[0]), _attempt())
    assert isinstance(first, CloseFailure) and (first.retry_class, first.reason, first.write_disposition) == (
        "retryable", "transport_connect", "not_written")
    # ... and the budgeted retry writes the marked comment exactly once
    world.fail_next("comment", "connect_error")
    final, log = executor().close(world.adapter(), close_command(refs[0]))
    assert isinstance(final, ConnectorReceipt) and log.results == ["close_failure:transport_connect", "receipt"]
    assert sum(1 for c in world.comments(refs[0]) if "[nexus:close:" in c) == 1


def test_the_retry_classifies_a_read_error(world):
    _first_transport_row(world, "read_error", "transport_read", "apply_then_read_error")


def test_the_retry_classifies_a_remote_protocol_error(world):
    _first_transport_row(world, "protocol_error", "transport_protocol", "apply_then_protocol_error")


@pytest.mark.parametrize("fault, reason", [
    ("authentication", "authentication"),
    ("authorization", "authorization"),
    ("ordinary_4xx", "ordinary_4xx"),
    ("invalid_payload", "invalid_payload"),
])
def test_terminal_fetch_failures_are_never_retried(world, fault, reason):
    world.add_issues(1)
    world.fail_next("list", fault, times=3)
    result, log = executor().fetch(world.adapter(), FetchIssuePage(cursor=None, page_size=10))
    assert isinstance(result, FetchFailure) and (result.retry_class, result.reason) == ("terminal", reason)
    assert log.attempts == 1 and writes(world, "list") == 1


@pytest.mark.parametrize("fault, reason", [
    ("authentication", "authentication"),
    ("authorization", "authorization"),
    ("ordinary_4xx", "ordinary_4xx"),
])
def test_terminal_close_failures_write_nothing_and_are_never_retried(world, fault, reason):
    (ref,) = world.add_issues(1)
    world.fail_next("comment", fault, times=3)
    result, log = executor().close(world.adapter(), close_command(ref))
    assert isinstance(result, CloseFailure)
    assert (result.retry_class, result.reason, result.write_disposition) == ("terminal", reason, "not_written")
    assert log.attempts == 1 and world.comments(ref) == [] and world.issue_state(ref) == "open"


def test_a_long_provider_wait_is_not_waited_out_in_request(world):
    world.add_issues(1)
    world.fail_next("list", "throttled_long")
    clock = FakeClock()
    result, log = executor(clock).fetch(world.adapter(), FetchIssuePage(cursor=None, page_size=10))
    assert isinstance(result, FetchFailure) and result.reason == "throttled"
    assert result.retry_after_seconds is not None and result.retry_after_seconds > DEADLINE_MS / 1000
    assert log.attempts == 1 and clock.sleeps == []


# -- bounds: attempts, deadline, delay and jitter, one operation per invocation -------------


def test_delay_is_capped_exponential_with_deterministic_bounded_jitter(world):
    world.add_issues(1)
    world.fail_next("list", "provider_5xx", times=MAX_ATTEMPTS)
    clock = FakeClock()
    executor(clock, jitter=0.5).fetch(world.adapter(), FetchIssuePage(cursor=None, page_size=10))
    expected = [capped_delay(n) * (1 + 0.5 * JITTER_FRACTION) for n in range(1, MAX_ATTEMPTS)]
    assert clock.sleeps == pytest.approx(expected)
    assert all(s <= DELAY_CAP_S * (1 + JITTER_FRACTION) for s in clock.sleeps)
    clock2 = FakeClock()
    world.fail_next("list", "provider_5xx", times=MAX_ATTEMPTS)
    executor(clock2, jitter=0.5).fetch(world.adapter(), FetchIssuePage(cursor=None, page_size=10))
    assert clock2.sleeps == clock.sleeps  # the same injected jitter, the same delays


def test_no_call_or_sleep_past_the_ten_second_deadline(world):
    world.add_issues(1)
    world.fail_next("list", "provider_5xx", times=MAX_ATTEMPTS)
    clock = FakeClock()
    slow = SlowTransport(world.transport, clock, seconds=4.0)
    result, log = executor(clock).fetch(world.adapter(transport=slow), FetchIssuePage(cursor=None, page_size=10))
    assert isinstance(result, FetchFailure) and result.retry_class == "retryable"
    deadline = DEADLINE_MS / 1000
    assert all(start < deadline for start in slow.started_at)  # no call starts past the deadline
    sleep_ends = [start + 4.0 + pause for start, pause in zip(slow.started_at, clock.sleeps)]
    assert all(end < deadline for end in sleep_ends)  # no sleep ends past it
    assert log.attempts == len(slow.started_at) < MAX_ATTEMPTS


class _CountingAdapter:
    """Counts the transport requests each invocation makes."""

    def __init__(self, inner, world) -> None:
        self.inner, self.world, self.per_call = inner, world, []

    def fetch_page(self, request, attempt):
        before = len(self.world.requests())
        result = self.inner.fetch_page(request, attempt)
        self.per_call.append(self.world.requests()[before:])
        return result

    def comment_and_close(self, command, attempt):
        before = len(self.world.requests())
        result = self.inner.comment_and_close(command, attempt)
        self.per_call.append(self.world.requests()[before:])
        return result


def test_exactly_one_transport_operation_per_invocation(world):
    refs = world.add_issues(3)
    world.fail_next("list", "provider_5xx", times=2)
    adapter = _CountingAdapter(world.adapter(), world)
    executor().fetch(adapter, FetchIssuePage(cursor=None, page_size=10))
    assert [len(calls) for calls in adapter.per_call] == [1, 1, 1]  # no private retry loop
    adapter.per_call.clear()
    world.fail_next("comment", "throttled")
    executor().close(adapter, close_command(refs[0]))
    for calls in adapter.per_call:
        ops = [op for op, _ in calls]
        assert ops.count("comment") <= 1 and ops.count("close") <= 1, ops


# -- bad bodies: an HTML page in place of the API, a body past the size cap ------------------


def test_an_html_page_with_status_200_is_named_as_such_and_never_retried(world):
    world.add_issues(1)
    world.state.faults.push(world.operations["list"], Fault(html=SIGN_IN_PAGE))
    result, log = executor().fetch(world.adapter(), FetchIssuePage(cursor=None, page_size=10))
    assert isinstance(result, FetchFailure) and (result.retry_class, result.reason) == ("terminal", "invalid_payload")
    assert "HTML page" in result.detail and "sign-in page" in result.detail and log.attempts == 1


def test_an_html_page_answering_a_comment_write_is_terminal_and_reconciled_before_anything_else(world):
    (ref,) = world.add_issues(1)
    world.state.faults.push(world.operations["comment"], Fault(html=SIGN_IN_PAGE))
    result, log = executor().close(world.adapter(), close_command(ref))
    assert isinstance(result, CloseFailure) and (result.retry_class, result.reason) == ("terminal", "invalid_payload")
    assert result.write_disposition == "reconciled_absent" and "HTML page" in result.detail
    assert log.attempts == 1 and world.comments(ref) == [] and world.issue_state(ref) == "open"


def test_a_body_past_the_size_cap_is_stopped_while_it_streams_and_says_which_limit(world):
    world.add_issues(1)
    huge = HugeBody(40 * 2**20)
    world.state.faults.push(world.operations["list"], Fault(huge_body=huge))
    result, log = executor().fetch(world.adapter(), FetchIssuePage(cursor=None, page_size=10))
    assert isinstance(result, FetchFailure) and (result.retry_class, result.reason) == ("terminal", "invalid_payload")
    assert "larger than the 16 MiB a response may hold" in result.detail and log.attempts == 1
    assert huge.served <= DEFAULT_MAX_BODY_BYTES + 2 * huge.chunk  # reading stopped at the cap, not at 40 MiB


# -- ambiguous writes: marker found, confirmed absent, inconclusive -------------------------


def test_marker_found_after_an_ambiguous_write_returns_the_receipt_without_a_rewrite(world):
    (ref,) = world.add_issues(1)
    world.fail_next("comment", "apply_then_timeout")
    command = close_command(ref)
    result, log = executor().close(world.adapter(), command)
    assert isinstance(result, ConnectorReceipt) and result.command_id == command.command_id and result.closed
    assert writes(world, "comment") == 1 and log.attempts == 1
    assert [c for c in world.comments(ref) if command.marker in c] and world.issue_state(ref) == "closed"


def test_confirmed_absence_permits_exactly_one_budgeted_retry(world):
    (ref,) = world.add_issues(1)
    world.fail_next("comment", "timeout")  # not applied: the lookup proves absence
    command = close_command(ref)
    result, log = executor().close(world.adapter(), command)
    assert log.results == ["close_failure:timeout", "receipt"] and isinstance(result, ConnectorReceipt)
    assert writes(world, "comment") == 2 and sum(command.marker in c for c in world.comments(ref)) == 1


def test_confirmed_absence_is_reported_as_reconciled_absent(world):
    (ref,) = world.add_issues(1)
    world.fail_next("comment", "apply_then_5xx")
    world.fail_next("comment", "timeout")
    adapter = world.adapter()
    first = adapter.comment_and_close(close_command(ref), _attempt())
    assert isinstance(first, ConnectorReceipt)  # applied then 5xx: found by marker
    (other,) = world.add_issues(1)
    second = adapter.comment_and_close(close_command(other, ticket=2), _attempt())
    assert isinstance(second, CloseFailure) and second.write_disposition == "reconciled_absent"
    assert second.retry_class == "retryable" and world.comments(other) == []


def test_inconclusive_reconciliation_returns_ambiguous_write_and_no_rewrite(world):
    (ref,) = world.add_issues(1)
    world.fail_next("comment", "apply_then_timeout")
    world.fail_next("lookup", "provider_5xx", times=5)
    result, log = executor().close(world.adapter(), close_command(ref))
    assert isinstance(result, AmbiguousWrite) and result.write_disposition == "reconciliation_inconclusive"
    assert log.attempts == 1 and writes(world, "comment") == 1 and writes(world, "close") == 0


def test_an_ambiguous_close_step_is_reconciled_from_the_issue_state(world):
    (ref,) = world.add_issues(1)
    world.fail_next("close", "apply_then_5xx")
    result, log = executor().close(world.adapter(), close_command(ref))
    assert isinstance(result, ConnectorReceipt) and world.issue_state(ref) == "closed"
    assert writes(world, "comment") == 1 and writes(world, "close") == 1


def test_reconcile_first_finds_an_earlier_marker_and_never_posts_twice(world):
    (ref,) = world.add_issues(1)
    command = close_command(ref, reconcile_first=True)
    world.add_comment(ref, "an earlier dispatch already wrote this\n\n" + command.marker)
    result, _ = executor().close(world.adapter(), command)
    assert isinstance(result, ConnectorReceipt) and writes(world, "comment") == 0
    assert world.issue_state(ref) == "closed"


def test_marker_matching_is_exact(world):
    (ref,) = world.add_issues(1)
    command = close_command(ref, reconcile_first=True)
    world.add_comment(ref, command.marker[:-2] + "]")  # a near miss is not the marker
    world.add_comment(ref, close_command(ref, ticket=9).marker)  # another command's marker
    result, _ = executor().close(world.adapter(), command)
    assert isinstance(result, ConnectorReceipt) and writes(world, "comment") == 1


def test_every_result_is_a_strict_value_with_its_discriminator(world):
    (ref,) = world.add_issues(1)
    results = []
    for fault in ("provider_5xx", "authentication", "invalid_payload"):
        world.fail_next("list", fault)
        results.append(world.adapter().fetch_page(FetchIssuePage(cursor=None, page_size=5), _attempt()))
    results.append(world.adapter().fetch_page(FetchIssuePage(cursor=None, page_size=5), _attempt()))
    world.fail_next("comment", "ordinary_4xx")
    results.append(world.adapter().comment_and_close(close_command(ref), _attempt()))
    results.append(world.adapter().comment_and_close(close_command(ref), _attempt()))
    kinds = [r.kind for r in results]
    assert kinds == ["fetch_failure", "fetch_failure", "fetch_failure", "page", "close_failure", "receipt"]
    for result in results:
        assert type(result).model_validate_json(result.model_dump_json()) == result


def test_no_credential_reaches_any_result(world):
    (ref,) = world.add_issues(1)
    texts = []
    for fault in ("authentication", "provider_5xx", "connect_error"):
        world.fail_next("list", fault)
        texts.append(world.adapter().fetch_page(FetchIssuePage(cursor=None, page_size=5), _attempt()).model_dump_json())
    world.fail_next("comment", "authorization")
    texts.append(world.adapter().comment_and_close(close_command(ref), _attempt()).model_dump_json())
    texts.append(repr(world.adapter()))
    for secret in world.secret_values:
        assert all(secret not in text for text in texts)


__all__ = [name for name in dir() if name.startswith("test_")]
