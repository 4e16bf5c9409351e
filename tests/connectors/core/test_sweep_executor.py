"""The retry executor holds the sweep's two operations to the seam like `fetch_page`: typed
results only, a page no larger than asked, a cursor that advances, "unchanged" only to a
request that named a validator, the issue asked for."""

from __future__ import annotations

from datetime import UTC, datetime

from nexus_pipelines.connectors.core.executor import RetryExecutor
from nexus_pipelines.connectors.core.sweep_values import (
    FetchedIssue,
    FetchIssue,
    IdentityPage,
    IssueIdentity,
    ListIdentities,
    UnchangedPage,
)
from nexus_pipelines.connectors.core.values import ExternalIssue, FetchFailure

WHEN = datetime(2026, 11, 1, tzinfo=UTC)


def _executor() -> RetryExecutor:
    return RetryExecutor(sleep=lambda s: None, jitter=lambda: 0.0)


def _issue(ref: str) -> ExternalIssue:
    return ExternalIssue(connector_kind="acme", external_ref=ref, title="t", description="", source_labels=(),
                         reporter_ref="u", reporter_display_name="", external_state="open",
                         external_updated_at=WHEN, display_url="https://acme.test/1")


class _Source:
    def __init__(self, *, page=None, fetched=None, fail=0):
        self.page, self.fetched, self.fail, self.calls = page, fetched, fail, 0

    def list_identities(self, request, attempt):
        self.calls += 1
        if self.calls <= self.fail:
            return FetchFailure(retry_class="retryable", reason="provider_5xx", detail="HTTP 502")
        return self.page

    def fetch_issue(self, request, attempt):
        self.calls += 1
        return self.fetched


def _page(n: int, cursor: str | None = "next") -> IdentityPage:
    return IdentityPage(identities=tuple(IssueIdentity(external_ref=f"acme:c:{i}", external_updated_at=WHEN)
                                         for i in range(n)), next_cursor=cursor)


def test_a_listing_larger_than_asked_is_a_terminal_contract_violation():
    result, log = _executor().list_identities(_Source(page=_page(3)), ListIdentities(cursor=None, page_size=2))
    assert (result.reason, result.retry_class, log.attempts) == ("contract_violation", "terminal", 1)


def test_a_listing_that_does_not_advance_its_cursor_is_a_contract_violation():
    result, _ = _executor().list_identities(_Source(page=_page(1, "same")), ListIdentities(cursor="same", page_size=5))
    assert result.reason == "contract_violation" and "advancing" in result.detail


def test_an_unchanged_answer_to_a_request_that_named_no_validator_is_a_contract_violation():
    source = _Source(page=UnchangedPage(served_at=WHEN))
    result, _ = _executor().list_identities(source, ListIdentities(cursor=None, page_size=5))
    assert result.reason == "contract_violation" and "no validator" in result.detail
    unchanged, _ = _executor().list_identities(source, ListIdentities(cursor=None, page_size=5, validator='W/"a1"'))
    assert isinstance(unchanged, UnchangedPage)


def test_a_retryable_listing_failure_is_retried_within_the_four_attempts():
    source = _Source(page=_page(2, None), fail=2)
    result, log = _executor().list_identities(source, ListIdentities(cursor=None, page_size=5))
    assert isinstance(result, IdentityPage) and log.attempts == 3


def test_a_read_that_answers_another_issue_is_a_contract_violation():
    source = _Source(fetched=FetchedIssue(issue=_issue("acme:c:2")))
    result, _ = _executor().fetch_issue(source, FetchIssue(external_ref="acme:c:1"))
    assert result.reason == "contract_violation" and "another issue" in result.detail


def test_a_read_returning_something_untyped_is_a_contract_violation():
    result, _ = _executor().fetch_issue(_Source(fetched={"issue": None}), FetchIssue(external_ref="acme:c:1"))
    assert result.reason == "contract_violation"
