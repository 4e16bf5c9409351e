"""One bounded poll tick under a leased, fenced claim, and the loop a poll run is
(docs/design/connector-contract.md, "The poll tick").

A tick claims one due registration revision, fetches at most one page through the
retry executor, checks the page against the seam (connector kind, identities, cursor
bounds, no secret in the cursor), and commits receipts plus the advanced cursor under
the claim's fence, or records the failure and its durable retry time. The outbound
side (close commands) is not part of a tick here: close commands are `issue.close`
work items, which the work queue's drains execute under their own fenced claims.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta

from psycopg import Connection

from nexus_pipelines.backoff import capped_exponential
from nexus_pipelines.connectors.core import store
from nexus_pipelines.connectors.core.executor import InvocationLog, RetryExecutor
from nexus_pipelines.connectors.core.protocol import IssueConnector
from nexus_pipelines.connectors.core.registration import Registration
from nexus_pipelines.connectors.core.registry import ConnectorRegistry
from nexus_pipelines.connectors.core.values import (
    ExternalIssue,
    ExternalIssuePage,
    FetchFailure,
    FetchIssuePage,
    FetchIssuePageResult,
    canonical_form,
    digest_of,
)
from nexus_pipelines.connectors.provider_gate import GateReading, admitted_by
from nexus_pipelines.heap import heap_before_frozen
from nexus_pipelines.redaction import contains_registered_secret, describe_exception
from nexus_pipelines.workqueue.receipts import canonical_json, canonical_json_with

# Durable schedule after a failed tick (separate from the in-request retries):
RETRYABLE_BACKOFF = (5.0, 900.0)  # base, cap seconds
TERMINAL_BACKOFF = (60.0, 3600.0)

Composer = Callable[[Registration], IssueConnector]


def failure_delay(failure_count: int, retry_class: str, retry_after: float | None,
                  rng: random.Random | None = None) -> float:
    """Seconds until the next poll after the n-th consecutive failure (n >= 1)."""
    base, cap = RETRYABLE_BACKOFF if retry_class == "retryable" else TERMINAL_BACKOFF
    delay = capped_exponential(failure_count, base, cap) * (0.5 + 0.5 * (rng or random).random())
    return max(delay, retry_after or 0.0)


@dataclass
class TickReport:
    registration_id: str
    revision_id: str
    outcome: str  # page | failure | lost
    issues: int = 0
    admitted: int = 0  # new receipts (issue versions not seen before)
    admitted_refs: list[str] = field(default_factory=list)
    excluded: int = 0
    rescan: bool = False  # the page proved a shift: the scan repeats from its bound
    exhausted: bool = False
    cursor: str | None = None
    attempts: int = 0
    sleeps_s: float = 0.0
    failure: str | None = None
    failure_class: str | None = None
    retry_in_s: float | None = None
    fetch_s: float = 0.0
    commit_s: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def _check_page(page: ExternalIssuePage, registration: Registration) -> str | None:
    """The seam's rules core enforces on every page; a violation is terminal."""
    for issue in page.issues:
        if issue.connector_kind != registration.kind:
            return f"an issue of kind {issue.connector_kind!r} came from a {registration.kind!r} connector"
    refs = [i.external_ref for i in page.issues]
    if len(set(refs)) != len(refs):
        return "a page delivered the same issue twice"
    if contains_registered_secret(page.next_cursor):
        return "the cursor token contains a credential"
    return None


def run_tick(
    conn: Connection,
    registry: ConnectorRegistry,
    compose: Composer,
    *,
    owner: str,
    executor: RetryExecutor,
    lease_ttl: timedelta = timedelta(seconds=60),
    registration_ids: Sequence[str] | None = None,
    rng: random.Random | None = None,
) -> TickReport | None:
    """Claim and run one tick; None when no revision is due."""
    request = store.ClaimRequest(registry, owner, lease_ttl, registration_ids)
    return _tick(conn, _claim(conn, request), request, compose, executor, rng, claim_next=False)[0]


NextClaim = store.PollClaim | store.UnreadableRevision | None


def _claim(conn: Connection, request: store.ClaimRequest) -> NextClaim:
    try:
        return store.claim(conn, request)
    except store.UnreadableRevision as unreadable:  # its lease is held: the tick records the failure
        return unreadable


Fetched = tuple[FetchIssuePageResult, InvocationLog, float]  # the result, the executor's log, seconds


def _fetch(executor: RetryExecutor, adapter: IssueConnector, request: FetchIssuePage) -> Fetched:
    started = time.perf_counter()
    result, log = executor.fetch(adapter, request)
    return result, log, time.perf_counter() - started


def _page_request(claim: store.PollClaim) -> FetchIssuePage:
    return FetchIssuePage(cursor=claim.cursor, page_size=claim.registration.page_size)


# the pages a run holds read ahead at most, one per revision: while more revisions take turns,
# a commit reads nothing ahead until a held page is used or dropped
MAX_PAGES_AHEAD = 8


@dataclass(frozen=True)
class ReadAhead:
    """A revision's next page, fetched while the commit of the page before was in flight: the
    request its scan makes next (the page's next cursor, which the commit stores)."""

    revision_id: str
    request: FetchIssuePage
    fetched: Fetched

    def page_for(self, claim: NextClaim) -> Fetched | None:
        """The page when `claim` asks for exactly it (same revision, cursor and page size), else
        None: it is discarded, and nothing of it was written."""
        if isinstance(claim, store.PollClaim) and claim.registration.revision_id == self.revision_id \
                and _page_request(claim) == self.request:
            return self.fetched
        return None


def _tick(conn: Connection, claim: NextClaim, request: store.ClaimRequest, compose: Composer, executor: RetryExecutor,
          rng: random.Random | None, *, claim_next: bool, fetched: Fetched | None = None,
          read_ahead: bool = False) -> tuple[TickReport | None, NextClaim, ReadAhead | None]:
    """Run one tick on a claim already taken (its page already `fetched` when it was read ahead);
    with `claim_next`, a page's commit also takes the next tick's claim, returned beside the
    report, and with `read_ahead` the next page of a scan that goes on, read while the commit is
    in flight (for this revision's next claim, which may come after other revisions' turns)."""
    if isinstance(claim, store.UnreadableRevision):
        return _unreadable(conn, claim, rng), None, None
    if claim is None:
        return None, None, None
    registration = claim.registration
    report = TickReport(registration.registration_id, registration.revision_id, "page")
    try:
        adapter = compose(registration)
    except Exception as exc:  # noqa: BLE001 - a composition failure is a durable, visible failure
        return _fail(conn, claim, report, "terminal", "composition_failed", describe_exception(exc, 300), None,
                     rng), None, None
    result, log, report.fetch_s = fetched or _fetch(executor, adapter, _page_request(claim))
    report.attempts, report.sleeps_s = log.attempts, sum(log.sleeps)
    if isinstance(result, FetchFailure):
        return _fail(conn, claim, report, result.retry_class, result.reason, result.detail,
                     result.retry_after_seconds, rng), None, None
    problem = _check_page(result, registration)
    if problem:
        return _fail(conn, claim, report, "terminal", "contract_violation", problem, None, rng), None, None
    version = IssueVersions(registration)
    versions = [version(issue) for issue in result.issues]
    ahead: list[ReadAhead] = []

    def read_next(gates: GateReading) -> None:  # the scan's next request, the same one the next tick would make
        following = FetchIssuePage(cursor=result.next_cursor, page_size=registration.page_size)
        with admitted_by(gates):  # the commit's flight read the gates: its first request asks no gate itself
            ahead.append(ReadAhead(registration.revision_id, following, _fetch(executor, adapter, following)))

    # an exhausted scan is not due again at once: its next claim is not this revision
    reads_ahead = claim_next and read_ahead and not result.exhausted
    started = time.perf_counter()
    try:
        commit = store.commit_page(conn, claim, versions, next_cursor=result.next_cursor, exhausted=result.exhausted,
                                   then_claim=request if claim_next else None,
                                   in_flight=read_next if reads_ahead else None)
    except store.PollLeaseLost as exc:  # the page read ahead, if any, is dropped with it
        report.outcome, report.failure = "lost", str(exc)
        return report, None, None
    # the commit's own time: the read ahead inside it is the next tick's fetch
    report.commit_s = time.perf_counter() - started - sum(a.fetched[2] for a in ahead)
    report.admitted_refs, report.admitted = commit.admitted_refs, len(commit.admitted_refs)
    report.issues, report.excluded, report.rescan = len(result.issues), result.excluded, result.rescan
    report.exhausted, report.cursor = result.exhausted, result.next_cursor
    return report, commit.next_claim, ahead[0] if ahead else None


_HOLE = "\x00"  # never inside canonical JSON text, which escapes every control character


class IssueVersions:
    """What a receipt carries, for one registration's issues: the normalized issue plus the facts
    core adds (digest, mapped labels, the revision and ticket project it was polled for), and
    that body's canonical JSON. The facts every receipt shares are serialized once, and each
    label set is mapped once, not once per issue."""

    def __init__(self, registration: Registration) -> None:
        self._registration = registration
        shared = {"revision_id": registration.revision_id, "project": registration.project}
        # the body's canonical JSON with a hole for each entry of its own (digest, issue, labels)
        self._parts = tuple(canonical_json_with(shared, digest=_HOLE, issue=_HOLE, labels=_HOLE).split(_HOLE))
        self._labels: dict[tuple[str, ...], str] = {}  # the mapped labels' canonical JSON by label set

    def __call__(self, issue: ExternalIssue) -> store.IssueVersion:
        form = canonical_form(issue)
        digest = digest_of(form)  # "sha256:" and hex digits: its JSON is itself in quotes
        # the issue is serialized once: the digest's form is its canonical JSON too when it is all ASCII
        body_form = form if form.isascii() else canonical_json(issue.model_dump(mode="json"))
        labels = self._labels.get(issue.source_labels)
        if labels is None:
            labels = self._labels[issue.source_labels] = canonical_json(
                list(self._registration.map_labels(issue.source_labels)))
        opening, after_digest, after_issue, closing = self._parts
        return store.IssueVersion(issue.external_ref, issue.external_updated_at, digest,
                                  f'{opening}"{digest}"{after_digest}{body_form}{after_issue}{labels}{closing}')


def _fail(conn: Connection, claim: store.PollClaim, report: TickReport, retry_class: str, reason: str, detail: str,
          retry_after: float | None, rng: random.Random | None) -> TickReport:
    delay = failure_delay(claim.failure_count + 1, retry_class, retry_after, rng)
    report.outcome, report.failure_class, report.failure = "failure", retry_class, f"{reason}: {detail}".rstrip(": ")
    report.retry_in_s = round(delay, 3)
    try:
        store.record_failure(conn, claim, failure_class=retry_class, reason=reason, detail=detail, delay_s=delay,
                             throttled_s=retry_after if reason == "throttled" else None)
    except store.PollLeaseLost as exc:
        report.outcome, report.failure = "lost", str(exc)
    return report


def _unreadable(conn: Connection, unreadable: store.UnreadableRevision, rng: random.Random | None) -> TickReport:
    """A stored revision this code cannot read fails terminally on its own schedule, so the
    run goes on with the other registrations."""
    report = TickReport(unreadable.registration_id, unreadable.revision_id, "failure", failure_class="terminal",
                        failure=f"registration_unreadable: {unreadable}")
    delay = failure_delay(unreadable.failure_count + 1, "terminal", None, rng)
    report.retry_in_s = round(delay, 3)
    if not store.record_unreadable(conn, unreadable, delay_s=delay):
        report.outcome = "lost"
    return report


@dataclass
class PollRunReport:
    ticks: list[TickReport] = field(default_factory=list)
    stopped: str = ""

    @property
    def totals(self) -> dict[str, int]:
        pages = [t for t in self.ticks if t.outcome == "page"]
        return {
            "ticks": len(self.ticks),
            "pages": len(pages),
            "issues_seen": sum(t.issues for t in pages),
            "admitted": sum(t.admitted for t in pages),
            "unchanged": sum(t.issues - t.admitted for t in pages),
            "excluded": sum(t.excluded for t in pages),
            "shift_rescans": sum(1 for t in pages if t.rescan),
            "failures": sum(1 for t in self.ticks if t.outcome == "failure"),
            "lost": sum(1 for t in self.ticks if t.outcome == "lost"),
            "attempts": sum(t.attempts for t in self.ticks),
        }


def poll(
    conn: Connection,
    registry: ConnectorRegistry,
    compose: Composer,
    *,
    owner: str,
    executor: RetryExecutor,
    registration_ids: Sequence[str] | None = None,
    max_ticks: int = 1000,
    time_budget_s: float = 300.0,
    lease_ttl: timedelta = timedelta(seconds=60),
    on_tick: Callable[[TickReport], None] | None = None,
) -> PollRunReport:
    """Run ticks until nothing is due, a failure stops the revision, or a budget is spent.

    Each tick is its own claim with a fresh fence; a revision whose scan is not exhausted
    is due again at once, so one run walks a full sync page by page. A page's commit takes
    the next tick's claim in its own transaction (one commit per page); a claim the run no
    longer uses is given back when it stops.

    A scan that goes on has its next page fetched while its page's commit is in flight (before
    `on_tick` reports that page), and held for that revision's next claim in this run, directly
    after or after other revisions' turns (at most `MAX_PAGES_AHEAD` held at once); that claim
    uses it only when it is the same revision at that cursor, so nothing of it is written unless
    that commit succeeded.
    """
    with heap_before_frozen():  # no full collection rescans the process's heap during the run
        run = PollRunReport()
        deadline = time.monotonic() + time_budget_s
        request = store.ClaimRequest(registry, owner, lease_ttl, registration_ids)
        claim, taken = None, False  # taken: the previous page's commit claimed for this tick
        ahead: dict[str, ReadAhead] = {}  # the pages read ahead, by revision
        while True:
            if len(run.ticks) >= max_ticks:
                run.stopped = "max_ticks"
                break
            if time.monotonic() >= deadline:
                run.stopped = "time_budget"
                break
            if not taken:
                claim = _claim(conn, request)
            held = ahead.pop(claim.registration.revision_id, None) if isinstance(claim, store.PollClaim) else None
            fetched = held.page_for(claim) if held is not None else None
            # the page's commit takes the next tick's claim when the run will go on
            goes_on = len(run.ticks) + 1 < max_ticks and time.monotonic() < deadline
            report, claim, read = _tick(conn, claim, request, compose, executor, None, claim_next=goes_on,
                                        fetched=fetched, read_ahead=len(ahead) < MAX_PAGES_AHEAD)
            if report is None:
                run.stopped = "idle"
                break
            if read is not None:
                ahead[read.revision_id] = read
            taken = goes_on and report.outcome == "page"
            run.ticks.append(report)
            if on_tick is not None:
                on_tick(report)
        if taken and claim is not None:  # claimed for a tick this run no longer runs
            store.release(conn, claim)
        return run
