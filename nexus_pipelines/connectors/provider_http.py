"""What every provider adapter's transport shares: turning an httpx outcome, or a token or
reference the adapter cannot read, into the seam's typed failures; an invocation's own
deadline; the close-back steps that are the same everywhere; and the bits of response
parsing that are the same everywhere (the `Link` header's `rel="next"`, the `Date` header,
a one-line pydantic error, a read's body or its failure).

Not core: providers choose their own status tables; these are the provider-neutral parts
of them. A `Problem` says whether a write may have been applied, which decides whether
a close must reconcile by marker before it may answer anything retryable (docs/design/connector-contract.md,
"Marker reconciliation").
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, TypeVar

import httpx
from pydantic import ValidationError

from nexus_pipelines.connectors.core.values import (
    CURSOR_MAX_CHARS,
    DETAIL_MAX_CHARS,
    AmbiguousWrite,
    CloseExternalIssue,
    CloseExternalIssueResult,
    CloseFailure,
    ConnectorAttempt,
    ConnectorReceipt,
    ExternalIssue,
    ExternalIssuePage,
    FetchFailure,
    first_error,
)
from nexus_pipelines.connectors.scan_cursor import CursorError
from nexus_pipelines.integrations.http import ENDPOINT, BodyTooLarge, EgressRefused, GateClosed, bounded_timeout, origin_of
from nexus_pipelines.redaction import one_line

T = TypeVar("T")


@dataclass(frozen=True)
class Problem:
    retry_class: str
    reason: str
    detail: str
    retry_after: float | None = None
    maybe_written: bool = False  # for writes: the request may have been applied


def exception_problem(exc: Exception) -> Problem:
    """The typed outcome of a transport exception; anything else is a programming error."""
    name = type(exc).__name__
    if isinstance(exc, EgressRefused):
        return Problem("terminal", "contract_violation", one_line(str(exc), 200))
    if isinstance(exc, GateClosed):
        return Problem("retryable", "throttled", one_line(str(exc), 250), exc.wait_s)
    if isinstance(exc, BodyTooLarge):  # the same answer would come again: a person lowers the page size
        return Problem("terminal", "invalid_payload", one_line(str(exc), 250), maybe_written=True)
    if isinstance(exc, (httpx.ConnectTimeout, httpx.PoolTimeout)):
        return Problem("retryable", "timeout", f"{name}: nothing was sent")
    if isinstance(exc, httpx.TimeoutException):
        return Problem("retryable", "timeout", name, maybe_written=True)
    if isinstance(exc, httpx.ConnectError):
        return Problem("retryable", "transport_connect", f"{name}: the connection was refused")
    if isinstance(exc, httpx.RemoteProtocolError):
        return Problem("retryable", "transport_protocol", name, maybe_written=True)
    if isinstance(exc, (httpx.ReadError, httpx.WriteError, httpx.CloseError)):
        return Problem("retryable", "transport_read", name, maybe_written=True)
    if isinstance(exc, httpx.DecodingError):
        return Problem("retryable", "transport_protocol", name, maybe_written=True)
    if isinstance(exc, httpx.TransportError):
        return Problem("retryable", "transport_connect", name, maybe_written=True)
    raise exc  # core turns an escaping exception into a contract violation


def redirect_problem(response: httpx.Response, what: str, hint: str) -> Problem | None:
    """A 3xx is terminal and never followed (`hint` says what the move probably was); None otherwise."""
    status = response.status_code
    if not 300 <= status < 400:
        return None
    where = origin_of(response.headers["Location"]) if response.headers.get("Location") else "elsewhere"
    return Problem("terminal", "ordinary_4xx", f"{what}: HTTP {status} to {where}{hint}; redirects are never followed")


def other_status_problem(response: httpx.Response, what: str, said: str = "") -> Problem:
    """What an answer means once the provider's own rows (redirects, credentials, limits)
    are read: 408 and 5xx may have been applied and are retried, any other is terminal."""
    status = response.status_code
    if status == 408:
        return Problem("retryable", "timeout", f"{what}: HTTP 408", maybe_written=True)
    if status >= 500:
        return Problem("retryable", "provider_5xx", f"{what}: HTTP {status}", maybe_written=True)
    return Problem("terminal", "ordinary_4xx", f"{what}: HTTP {status} {said}".rstrip())


# The longest wait a throttled result carries (the seam's bound): a provider asking for
# longer is asked again then, instead of the throttle turning into a contract violation.
LONGEST_WAIT_S = 86_400.0


def _wait(problem: Problem) -> float | None:
    if problem.reason != "throttled" or problem.retry_after is None:
        return None
    return min(max(problem.retry_after, 0.0), LONGEST_WAIT_S)


def fetch_failure(problem: Problem) -> FetchFailure:
    return FetchFailure(retry_class=problem.retry_class, reason=problem.reason,
                        detail=problem.detail[:DETAIL_MAX_CHARS], retry_after_seconds=_wait(problem))


def close_failure(problem: Problem, disposition: str = "not_written") -> CloseFailure:
    return CloseFailure(retry_class=problem.retry_class, reason=problem.reason, write_disposition=disposition,
                        detail=problem.detail[:DETAIL_MAX_CHARS], retry_after_seconds=_wait(problem))


def invalid_payload(detail: str) -> FetchFailure:
    """The failure for an answer that parsed but breaks what the adapter may accept (terminal)."""
    return FetchFailure(retry_class="terminal", reason="invalid_payload", detail=detail[:DETAIL_MAX_CHARS])


def decoded_cursor(decode: Callable[[str | None], T], token: str | None) -> T | FetchFailure:
    """A fetch's cursor token decoded; one the provider's cursor cannot read is a contract violation."""
    try:
        return decode(token)
    except CursorError as exc:
        return FetchFailure(retry_class="terminal", reason="contract_violation", detail=f"cursor: {exc}")


class PageCursor(Protocol):
    """A provider's cursor once it has taken a page (`GitHubCursor`, `GitLabCursor`, `JiraCursor`)."""

    rescan: bool

    @property
    def scan_goes_on(self) -> bool: ...

    def encode(self) -> str: ...


def issue_page(issues: list[ExternalIssue], excluded: int, after: PageCursor,
               too_long: str) -> ExternalIssuePage | FetchFailure:
    """The page a fetch answers, with the token of the cursor `after` it; a token longer than
    the seam carries is the provider's answer's fault (`too_long` names the part that grew)."""
    token = after.encode()
    if len(token) > CURSOR_MAX_CHARS:
        return invalid_payload(too_long)
    return ExternalIssuePage(issues=tuple(issues), next_cursor=token, exhausted=not after.scan_goes_on,
                             excluded=excluded, rescan=after.rescan)


def item_of(external_ref: str, kind: str, container: str) -> str | None:
    """The item part of `external_ref` when it names an item of this registration
    (`<kind>:<container>:<digits>`), else None."""
    ref_kind, _, rest = external_ref.partition(":")
    ref_container, _, item = rest.partition(":")
    return item if ref_kind == kind and ref_container == container and item.isdigit() else None


@dataclass(frozen=True)
class MarkerLookup:
    """A search of one issue's comments for a command's marker: found (the comment id),
    absent (`found` and `problem` both None), or inconclusive (`problem` says why)."""

    found: str | None = None
    problem: Problem | None = None


# A reconciliation read that fails retryably (a 5xx on the issue or its comments) is asked
# again inside the same invocation, at most this many times in all: every read goes through
# `send`, so none outlives the invocation's deadline. Reads only: a write is never repeated here.
RECONCILE_READS = 3


def _reread(read: Callable[[], T], problem_of: Callable[[T], Problem | None]) -> T:
    for _ in range(RECONCILE_READS - 1):
        result = read()
        problem = problem_of(result)
        if problem is None or problem.retry_class != "retryable":
            return result
    return read()


def lookup_marker(find_marker: Callable[[], MarkerLookup]) -> MarkerLookup:
    """The marker lookup, read again while it is inconclusive for a retryable reason."""
    return _reread(find_marker, lambda lookup: lookup.problem)


def earlier_comment(command: CloseExternalIssue,
                    find_marker: Callable[[], MarkerLookup]) -> tuple[str | None, CloseFailure | None]:
    """Before anything is written: (the comment an earlier invocation of `command` left, found
    by its marker when core says one may have, else None; None), or (None, the failure when
    the lookup cannot tell)."""
    if not command.reconcile_first:
        return None, None
    lookup = lookup_marker(find_marker)
    if lookup.problem is not None:
        return None, close_failure(lookup.problem)
    return lookup.found, None


def close_receipt(command: CloseExternalIssue, comment_ref: str) -> ConnectorReceipt:
    return ConnectorReceipt(command_id=command.command_id, external_ref=command.external_ref,
                            marker=command.marker, comment_ref=comment_ref)


def after_comment_write(problem: Problem,
                        find_marker: Callable[[], MarkerLookup]) -> tuple[str | None, CloseFailure | AmbiguousWrite | None]:
    """The comment write failed with `problem`: (the comment id found by its marker, None) or
    (None, the failure to return). Only a write that may have landed is looked up (marker reconciliation)."""
    if not problem.maybe_written:
        return None, close_failure(problem)
    lookup = lookup_marker(find_marker)
    if lookup.found is not None:
        return lookup.found, None
    if lookup.problem is None:
        return None, close_failure(problem, "reconciled_absent")
    return None, AmbiguousWrite(detail=f"{problem.detail}; marker lookup: {lookup.problem.detail}"[:DETAIL_MAX_CHARS])


def after_close_write(problem: Problem, read_closed: Callable[[], bool | Problem],
                      receipt: Callable[[], ConnectorReceipt]) -> CloseExternalIssueResult:
    """The close write failed with `problem`: a write that may have landed is settled by the
    issue's state (closed: the receipt; open: reconciled absent; unreadable: ambiguous)."""
    if not problem.maybe_written:
        return close_failure(problem)
    closed = _reread(read_closed, lambda answer: answer if isinstance(answer, Problem) else None)
    if isinstance(closed, Problem):
        return AmbiguousWrite(detail=f"{problem.detail}; the issue's state could not be read "
                                     f"({closed.detail})"[:DETAIL_MAX_CHARS])
    return receipt() if closed else close_failure(problem, "reconciled_absent")


class Deadline:
    """The invocation's own view of its budget: every request's timeout fits inside it."""

    def __init__(self, attempt: ConnectorAttempt) -> None:
        self._end = time.monotonic() + attempt.deadline_remaining_milliseconds / 1000.0

    def timeout(self) -> httpx.Timeout | None:
        remaining_ms = int((self._end - time.monotonic()) * 1000)
        return bounded_timeout(remaining_ms) if remaining_ms >= 1 else None


def send(client: httpx.Client, method: str, url: str, deadline: Deadline, endpoint: str,
         **kwargs) -> httpx.Response | Problem:
    """One request inside the invocation's budget; a transport failure, an oversized body or
    an HTML page in place of the API's answer comes back as its Problem."""
    timeout = deadline.timeout()
    if timeout is None:
        return Problem("retryable", "timeout", f"{endpoint}: no budget left; nothing was sent")
    try:
        response = client.request(method, url, timeout=timeout, extensions={ENDPOINT: endpoint}, **kwargs)
    except Exception as exc:  # noqa: BLE001 - every transport failure is classified
        return exception_problem(exc)
    return html_page_problem(response, endpoint) or response


def html_page_problem(response: httpx.Response, endpoint: str) -> Problem | None:
    """A 2xx HTML page is no API answer: a proxy, captive portal or sign-in page stands in the
    way, and asking again gets the same page (terminal). A write may still have gone through."""
    if not 200 <= response.status_code < 300:
        return None
    kind = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
    start = response.content[:64].lstrip().lower()
    if kind not in ("text/html", "application/xhtml+xml") and not start.startswith((b"<!doctype html", b"<html")):
        return None
    return Problem("terminal", "invalid_payload",
                   f"{endpoint}: HTTP {response.status_code} answered with an HTML page, not the API's JSON (a "
                   f"proxy, captive portal or sign-in page in front of {origin_of(response.request.url)}); check "
                   "the network path and the configured URL", maybe_written=response.request.method != "GET")


def next_link(response: httpx.Response) -> str | None:
    """The `rel="next"` URL of a `Link` header, exactly as given (None when there is none)."""
    for part in response.headers.get("Link", "").split(","):
        url, _, params = part.strip().partition(";")
        if 'rel="next"' in params.replace(" ", ""):
            return url.strip().strip("<>")
    return None


def served_at(response: httpx.Response) -> datetime | None:
    """The provider's clock when it answered (its `Date` header), or None (also for a date that
    is no UTC datetime: 31 Dec 9999 23:59 -0100 is in the year 10000)."""
    try:
        return email.utils.parsedate_to_datetime(response.headers["Date"]).astimezone(UTC)
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


def body_is_truncated(exc: ValidationError) -> bool:
    """A 2xx body that is not complete JSON: the transport failed, not the schema."""
    return any(e["type"] == "json_invalid" for e in exc.errors())


def unreadable_body(exc: ValidationError, what: str) -> FetchFailure:
    """The failure for a 2xx body the strict model refused: a cut body is the transport's
    (`transport_protocol`, retried), anything else the payload's (`invalid_payload`)."""
    if body_is_truncated(exc):
        return FetchFailure(retry_class="retryable", reason="transport_protocol",
                            detail=f"{what}: the response body is not complete JSON")
    return invalid_payload(f"{what}: {first_error(exc)}")


def read_body(response: httpx.Response | Problem, what: str, classify: Callable[[httpx.Response, str], Problem],
              parse: Callable[[bytes], T]) -> T | FetchFailure:
    """A read's answer: the body of a 200 as `parse` reads it, or the fetch failure (the
    transport's problem, the provider's `classify` of any other status, `unreadable_body`)."""
    if isinstance(response, Problem):
        return fetch_failure(response)
    if response.status_code != 200:
        return fetch_failure(classify(response, what))
    try:
        return parse(response.content)
    except ValidationError as exc:
        return unreadable_body(exc, what)
