"""The core-owned retry executor (docs/design/connector-contract.md, "The retry executor"): at
most four attempts inside a ten-second
monotonic deadline, capped exponential delay plus bounded, injectable jitter.

Core alone creates each `ConnectorAttempt`, measures the deadline, decides whether
another attempt is allowed and sleeps between attempts. No attempt starts and no sleep
ends past the deadline: when the next delay would exhaust the budget, the last failure
is returned. A provider's Retry-After longer than the delay cap is never waited out in
request: the failure goes back to the caller, whose durable schedule waits instead.
An exception escaping the adapter is a terminal contract violation, and so is a result
that breaks the seam (wrong type, a page larger than asked, a receipt for another
command, a non-empty page that does not advance the cursor).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from pydantic import ValidationError

from nexus_pipelines.backoff import capped_exponential
from nexus_pipelines.connectors.core.protocol import IssueConnector
from nexus_pipelines.connectors.core.sweep_values import (
    FetchedIssue,
    FetchIssue,
    FetchIssueResult,
    IdentityPage,
    ListIdentities,
    ListIdentitiesResult,
    SweepSource,
    UnchangedPage,
)
from nexus_pipelines.connectors.core.values import (
    DEADLINE_MS,
    MAX_ATTEMPTS,
    AmbiguousWrite,
    CloseExternalIssue,
    CloseExternalIssueResult,
    CloseFailure,
    ConnectorAttempt,
    ConnectorReceipt,
    ExternalIssuePage,
    FetchFailure,
    FetchIssuePage,
    FetchIssuePageResult,
    first_error,
)
from nexus_pipelines.redaction import describe_exception, one_line

BASE_DELAY_S = 0.25
DELAY_CAP_S = 2.0
JITTER_FRACTION = 0.25  # jitter adds at most a quarter of the capped delay

R = TypeVar("R")


def capped_delay(attempt_number: int) -> float:
    """The delay after failed attempt n, before jitter: 0.25 s, 0.5 s, 1 s, capped at 2 s."""
    return capped_exponential(attempt_number, BASE_DELAY_S, DELAY_CAP_S)


@dataclass
class InvocationLog:
    """What the executor did, for metadata and tests: one entry per attempt and sleep."""

    attempts: int = 0
    sleeps: list[float] = field(default_factory=list)
    results: list[str] = field(default_factory=list)


class RetryExecutor:
    """Runs one adapter operation under the contract's hard bounds.

    `clock` is monotonic seconds, `sleep` blocks, `jitter` returns a unit value in [0, 1)
    (clamped) that scales the jitter; tests inject all three.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] | None = None,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._jitter = jitter or random.Random().random

    def fetch(self, adapter: IssueConnector, request: FetchIssuePage) -> tuple[FetchIssuePageResult, InvocationLog]:
        def check(result: object) -> FetchIssuePageResult:
            if isinstance(result, FetchFailure):
                return result
            if not isinstance(result, ExternalIssuePage):
                raise _Broken(f"fetch_page returned {type(result).__name__}, not a page or a fetch failure")
            if len(result.issues) > request.page_size:
                raise _Broken(f"fetch_page returned {len(result.issues)} issues for a page of {request.page_size}")
            if result.next_cursor == request.cursor and (result.issues or not result.exhausted):
                # a page advances the token or declares exhaustion (else a poll could spin)
                raise _Broken("fetch_page returned a page without advancing the cursor or declaring exhaustion")
            return result

        def broken(detail: str) -> FetchFailure:
            return FetchFailure(retry_class="terminal", reason="contract_violation", detail=one_line(detail, 300))

        return self._run(lambda attempt: adapter.fetch_page(request, attempt), check, broken)

    def close(
        self, adapter: IssueConnector, command: CloseExternalIssue
    ) -> tuple[CloseExternalIssueResult, InvocationLog]:
        def check(result: object) -> CloseExternalIssueResult:
            if isinstance(result, (CloseFailure, AmbiguousWrite)):
                return result
            if not isinstance(result, ConnectorReceipt):
                raise _Broken(f"comment_and_close returned {type(result).__name__}, not a close result")
            if (result.command_id, result.external_ref, result.marker) != (
                command.command_id, command.external_ref, command.marker
            ):
                raise _Broken("comment_and_close returned a receipt for another command, issue or marker")
            return result

        def broken(detail: str) -> CloseFailure:
            return CloseFailure(retry_class="terminal", reason="contract_violation", write_disposition="not_written",
                                detail=one_line(detail, 300))

        attempts_made = 0

        def invoke(attempt: ConnectorAttempt) -> object:
            nonlocal attempts_made
            # After any attempt of this command, the next must look for the marker before writing.
            current = command if attempts_made == 0 else command.model_copy(update={"reconcile_first": True})
            attempts_made += 1
            return adapter.comment_and_close(current, attempt)

        return self._run(invoke, check, broken)

    def list_identities(self, source: SweepSource, request: ListIdentities) -> tuple[ListIdentitiesResult, InvocationLog]:
        """One page of a reconciliation sweep's listing, under the same bounds as a poll's page."""
        def check(result: object) -> ListIdentitiesResult:
            if isinstance(result, FetchFailure):
                return result
            if isinstance(result, UnchangedPage):
                if request.validator is None:
                    raise _Broken("list_identities answered 'unchanged' to a request that named no validator")
                return result
            if not isinstance(result, IdentityPage):
                raise _Broken(f"list_identities returned {type(result).__name__}, not a page or a fetch failure")
            if len(result.identities) > request.page_size:
                raise _Broken(f"list_identities returned {len(result.identities)} issues for a page of "
                              f"{request.page_size}")
            if result.next_cursor is not None and result.next_cursor == request.cursor:
                raise _Broken("list_identities returned a page without advancing the cursor")
            return result

        return self._run(lambda attempt: source.list_identities(request, attempt), check, _broken_fetch)

    def fetch_issue(self, source: SweepSource, request: FetchIssue) -> tuple[FetchIssueResult, InvocationLog]:
        """One issue read in full for a sweep's gap."""
        def check(result: object) -> FetchIssueResult:
            if isinstance(result, FetchFailure):
                return result
            if not isinstance(result, FetchedIssue):
                raise _Broken(f"fetch_issue returned {type(result).__name__}, not an issue or a fetch failure")
            if result.issue is not None and result.issue.external_ref != request.external_ref:
                raise _Broken("fetch_issue returned another issue than the one asked for")
            return result

        return self._run(lambda attempt: source.fetch_issue(request, attempt), check, _broken_fetch)

    def _run(self, invoke: Callable[[ConnectorAttempt], object], check: Callable[[object], R],
             broken: Callable[[str], R]) -> tuple[R, InvocationLog]:
        log = InvocationLog()
        deadline = self._clock() + DEADLINE_MS / 1000.0
        result: R | None = None
        for number in range(1, MAX_ATTEMPTS + 1):
            remaining_ms = int((deadline - self._clock()) * 1000)
            if remaining_ms < 1:
                break
            attempt = ConnectorAttempt(attempt_number=number, deadline_remaining_milliseconds=min(remaining_ms,
                                                                                                   DEADLINE_MS))
            log.attempts += 1
            try:
                result = check(invoke(attempt))
            except _Broken as exc:
                result = broken(str(exc))
            except ValidationError as exc:
                more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
                result = broken(f"the adapter built an invalid value: {first_error(exc)}{more}")
            except Exception as exc:  # noqa: BLE001 - an escaping adapter exception is a contract violation
                result = broken(f"the adapter raised {describe_exception(exc, 250)}")
            log.results.append(_describe(result))
            if getattr(result, "retry_class", None) != "retryable" or number == MAX_ATTEMPTS:
                break
            delay = self._delay(number, getattr(result, "retry_after_seconds", None))
            # A late result cannot authorize a further attempt, nor a sleep past the deadline.
            if delay is None or self._clock() + delay >= deadline:
                break
            log.sleeps.append(delay)
            self._sleep(delay)
        assert result is not None, "the deadline cannot pass before the first attempt"
        return result, log

    def _delay(self, number: int, retry_after: float | None) -> float | None:
        if retry_after is not None and retry_after > DELAY_CAP_S:
            return None  # the provider asks for longer than core waits in request
        base = capped_delay(number)
        unit = min(max(float(self._jitter()), 0.0), 1.0)
        delay = base + unit * JITTER_FRACTION * base
        return max(delay, retry_after or 0.0)


def _broken_fetch(detail: str) -> FetchFailure:
    return FetchFailure(retry_class="terminal", reason="contract_violation", detail=one_line(detail, 300))


class _Broken(Exception):
    """A result that breaks the seam's rules."""


def _describe(result: object) -> str:
    kind = getattr(result, "kind", type(result).__name__)
    reason = getattr(result, "reason", None)
    return f"{kind}:{reason}" if reason else str(kind)
