"""The core retry executor holds the seam's rules whatever an adapter does."""

from __future__ import annotations

from datetime import UTC, datetime

from nexus_pipelines.connectors.core.closeback import close_comment, command_id, marker
from nexus_pipelines.connectors.core.executor import RetryExecutor
from nexus_pipelines.connectors.core.values import (
    CloseExternalIssue,
    CloseFailure,
    ConnectorReceipt,
    ExternalIssue,
    ExternalIssuePage,
    FetchFailure,
    FetchIssuePage,
)
from tests.connectors.conformance.suite import FakeClock


class Scripted:
    """An adapter that returns (or raises) what it is told, and records its attempts."""

    def __init__(self, *results) -> None:
        self.results = list(results)
        self.attempts = []
        self.commands = []

    def _next(self, attempt):
        self.attempts.append(attempt)
        result = self.results.pop(0)
        if isinstance(result, BaseException):
            raise result
        return result(attempt) if callable(result) else result

    def fetch_page(self, request, attempt):
        return self._next(attempt)

    def comment_and_close(self, command, attempt):
        self.commands.append(command)
        return self._next(attempt)


def run(adapter, clock=None, request=None):
    clock = clock or FakeClock()
    return RetryExecutor(clock=clock, sleep=clock.sleep, jitter=lambda: 0.0).fetch(
        adapter, request or FetchIssuePage(cursor="c0", page_size=2))


def one_issue(n: int = 1) -> ExternalIssue:
    return ExternalIssue(connector_kind="gitlab", external_ref=f"gitlab:1:{n}", title="t", description="",
                         source_labels=(), reporter_ref="u", reporter_display_name="", external_state="open",
                         external_updated_at=datetime(2026, 1, 1, tzinfo=UTC), display_url="https://x.test")


def test_an_escaping_adapter_exception_is_a_terminal_contract_violation():
    result, log = run(Scripted(RuntimeError("boom token=hunter2secret")))
    assert isinstance(result, FetchFailure) and (result.retry_class, result.reason) == ("terminal", "contract_violation")
    assert log.attempts == 1 and "hunter2secret" not in result.detail


def test_a_page_larger_than_asked_or_a_non_advancing_cursor_is_refused():
    big = ExternalIssuePage(issues=(one_issue(1), one_issue(2), one_issue(3)), next_cursor="c1", exhausted=True)
    assert run(Scripted(big))[0].reason == "contract_violation"
    stuck = ExternalIssuePage(issues=(one_issue(),), next_cursor="c0", exhausted=False)
    assert run(Scripted(stuck))[0].reason == "contract_violation"
    spinning = ExternalIssuePage(issues=(), next_cursor="c0", exhausted=False)
    assert run(Scripted(spinning))[0].reason == "contract_violation"  # neither advances nor declares exhaustion
    empty_same = ExternalIssuePage(issues=(), next_cursor="c0", exhausted=True)
    assert run(Scripted(empty_same))[0].kind == "page"  # nothing new: the same token is fine


def test_a_value_the_adapter_could_not_build_says_which_field_and_which_limit_it_broke():
    def oversized(attempt):
        return ExternalIssuePage(issues=tuple(one_issue(n) for n in range(101)), next_cursor="c1", exhausted=True)

    result, _ = run(Scripted(oversized), request=FetchIssuePage(cursor="c0", page_size=100))
    assert isinstance(result, FetchFailure) and result.reason == "contract_violation"
    assert result.detail.startswith("the adapter built an invalid value: issues: ")
    assert "at most 100 items" in result.detail


def test_a_wrong_result_type_is_a_contract_violation():
    wrong = CloseFailure(retry_class="retryable", reason="timeout", write_disposition="not_written")
    assert run(Scripted(wrong))[0].reason == "contract_violation"


def test_a_late_result_authorizes_no_further_attempt():
    clock = FakeClock()

    def late(attempt):
        clock.now += 9.95  # the invocation ran to the edge of the budget
        return FetchFailure(retry_class="retryable", reason="timeout")

    adapter = Scripted(late, late)
    result, log = run(adapter, clock)
    assert log.attempts == 1 and clock.sleeps == [] and result.reason == "timeout"


def test_attempt_budgets_shrink_and_the_attempt_number_grows():
    failure = FetchFailure(retry_class="retryable", reason="provider_5xx")
    adapter = Scripted(failure, failure, failure, failure)
    run(adapter)
    assert [a.attempt_number for a in adapter.attempts] == [1, 2, 3, 4]
    budgets = [a.deadline_remaining_milliseconds for a in adapter.attempts]
    assert budgets == sorted(budgets, reverse=True) and budgets[0] == 10_000


def test_a_retried_close_asks_the_adapter_to_reconcile_first():
    cid = command_id("t", 1, 1)
    command = CloseExternalIssue(external_ref="gitlab:1:1", command_id=cid, marker=marker(cid),
                                 comment=close_comment(ticket_id=1, proof_id=1, evidence="e", recorded_by="o",
                                                       command=cid))
    receipt = ConnectorReceipt(command_id=cid, external_ref="gitlab:1:1", marker=marker(cid), comment_ref="n:1")
    adapter = Scripted(CloseFailure(retry_class="retryable", reason="throttled", write_disposition="not_written"),
                       receipt)
    clock = FakeClock()
    result, _ = RetryExecutor(clock=clock, sleep=clock.sleep, jitter=lambda: 0.0).close(adapter, command)
    assert result == receipt and [c.reconcile_first for c in adapter.commands] == [False, True]
    other = ConnectorReceipt(command_id=command_id("t", 2, 2), external_ref="gitlab:1:1",
                             marker=marker(command_id("t", 2, 2)), comment_ref="n:2")
    result, _ = RetryExecutor(clock=clock, sleep=clock.sleep).close(Scripted(other), command)
    assert result.reason == "contract_violation"
