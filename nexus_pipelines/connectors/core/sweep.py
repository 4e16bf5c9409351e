"""The reconciliation sweep of one registration: the safety net under the incremental scans.

It lists the container's issue identities and provider update times (the provider's
`SweepSource`, one request per invocation through the retry executor, bounded by pages and
time), compares them with custody and the newest observed version, reads every gap in full
through the adapter's strict mapping, and admits one receipt per gap under the
registration's fenced poll lease, so the gap takes the normal path (router ->
`ticket.observe`). A gap is an issue with no custody link, or whose listed update time is
newer than every observation of it, and no receipt of that version still on its way (a
poll's receipt not drained yet is not a miss). The lease is held only while the gaps are
compared again and admitted: a poll committing meanwhile either lands first (its version is
then on its way, not a gap) or after (its receipt is a duplicate the observation ignores).
Each sweep and its gaps are recorded (`connector_sweeps`, `connector_sweep_gaps`). Where the
provider offers conditional requests, each page is asked with the validator of the page the
last sweep read (`sweep_pages`), and an unchanged page is compared from that stored listing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from psycopg import Connection

from nexus_pipelines.connectors.core import store, sweep_pages
from nexus_pipelines.connectors.core.executor import RetryExecutor
from nexus_pipelines.connectors.core.registration import Registration
from nexus_pipelines.connectors.core.registry import ConnectorRegistry
from nexus_pipelines.connectors.core.sweep_values import (
    MAX_IDENTITY_PAGE,
    FetchIssue,
    IdentityPage,
    ListIdentities,
    SweepSource,
    UnchangedPage,
)
from nexus_pipelines.connectors.core.tick import IssueVersions
from nexus_pipelines.connectors.core.values import FetchFailure
from nexus_pipelines.redaction import one_line
from nexus_pipelines.workqueue.receipts import canonical_json
from nexus_pipelines.workqueue.states import UNFINISHED, sql_in

# Each sweep admits under a namespace of its own: a version lost again after one sweep restored
# it is admitted again by the next (a shared namespace would refuse it as already delivered).
SWEEP_NAMESPACE = "issue-sweep"
SWEPT_MARK = "swept"  # the receipt body key that says a sweep found this version missing


@dataclass(frozen=True)
class SweepBounds:
    max_pages: int = 2000  # 200,000 issues at 100 a page
    time_budget_s: float = 1800.0  # listing and reading gaps (the lease wait and the commit come after)
    max_gaps: int = 1000  # read in full and admitted per sweep; the next sweep takes the rest
    lease_wait_s: float = 30.0  # how long to wait for a poll tick to give the registration's lease back
    # An issue changed this recently is still the incremental scans' to read (their next scan
    # starts no later than it): not judged. None: two poll intervals, at least 5 minutes,
    # plus a minute for the provider's clock.
    settle_s: float | None = None

    def settle(self, registration: Registration) -> timedelta:
        if self.settle_s is not None:
            return timedelta(seconds=self.settle_s)
        return timedelta(seconds=max(2 * registration.poll_interval_seconds, 300) + 60)


@dataclass(frozen=True)
class Gap:
    external_ref: str
    listed_updated_at: datetime
    reason: str  # missing | stale


@dataclass
class SweepReport:
    registration_id: str
    revision_id: str
    outcome: str = "complete"  # complete | partial | failed | lease_busy | inactive (not swept: not polled)
    listed: int = 0
    recent: int = 0  # listed, but changed too recently to judge (see SweepBounds.settle_s)
    excluded: int = 0
    pages: int = 0
    unchanged_pages: int = 0  # answered "not modified" to the validator of the page the last sweep read
    calls: int = 0
    gaps: list[Gap] = field(default_factory=list)
    reobserved: list[str] = field(default_factory=list)
    detail: str = ""
    sweep_id: int | None = None

    def line(self) -> str:
        """The one line the CLI prints and the job logs."""
        tail = f" ({self.detail})" if self.detail else ""
        return (f"{self.registration_id} sweep {self.outcome}: listed {self.listed}, gaps {len(self.gaps)}, "
                f"re-observed {len(self.reobserved)}, calls {self.calls}, unchanged pages {self.unchanged_pages}{tail}")

    def as_dict(self) -> dict:
        return {**asdict(self), "gaps": len(self.gaps), "reobserved": len(self.reobserved)}


SourceFor = Callable[[Registration], SweepSource]


def sweep(conn: Connection, registry: ConnectorRegistry, registration: Registration, source_for: SourceFor, *,
          owner: str, executor: RetryExecutor, bounds: SweepBounds = SweepBounds(),
          on_page: Callable[[SweepReport], None] | None = None, sleep: Callable[[float], None] = time.sleep,
          ) -> SweepReport:
    """Sweep one registration's active revision and record the outcome."""
    report = SweepReport(registration.registration_id, registration.revision_id)
    started, active = conn.execute(
        """SELECT now(), (SELECT revision_id FROM connector_registrations
                           WHERE tenant = %s AND registration_key = %s AND status = 'active')""",
        (registration.tenant, registration.key)).fetchone()
    if active != registration.revision_id:
        report.outcome = "inactive"
        report.detail = (f"revision {registration.revision_id} is not the active one ({active or 'none is active'}); "
                         "run `nexus-pipelines connectors activate` first")
        return report  # nothing was swept, so nothing is recorded
    source = source_for(registration)
    deadline = time.monotonic() + bounds.time_budget_s
    listing = _Listing(sweep_pages.load(conn, registration))
    listed, provider_started = _list(source, executor, bounds, deadline, report, listing, on_page)
    if report.outcome != "failed":
        settle = bounds.settle(registration)
        horizon = (provider_started or started) - settle
        judged = {ref: moment for ref, moment in listed.items() if not settle or moment < horizon}
        report.recent = len(listed) - len(judged)
        candidates = _gaps(conn, registration, judged)
        report.gaps = candidates[:bounds.max_gaps]
        if len(candidates) > bounds.max_gaps:
            report.outcome = "partial"
            report.detail = f"{len(candidates) - bounds.max_gaps} more gaps are left for the next sweep"
        _reobserve(conn, registration, source, executor, report, deadline,
                   lambda: _claim(conn, registry, registration, owner, bounds.lease_wait_s, sleep))
    _record(conn, registration, report, started, listing)
    return report


@dataclass
class _Listing:
    """The pages the last sweep kept (by request) and the pages this sweep read in full."""

    kept: dict[str, sweep_pages.KeptPage]
    read: dict[str, IdentityPage] = field(default_factory=dict)
    asked: set[str] = field(default_factory=set)
    to_the_end: bool = False  # the listing reached its last page

    def request(self, cursor: str | None) -> ListIdentities:
        request = ListIdentities(cursor=cursor, page_size=MAX_IDENTITY_PAGE)
        kept = self.kept.get(sweep_pages.page_key(request))
        return request.model_copy(update={"validator": kept.validator}) if kept else request

    def answer(self, request: ListIdentities, result: IdentityPage | UnchangedPage) -> IdentityPage:
        """The page's listing: read now, or kept by the last sweep when the provider says it is unchanged."""
        key = sweep_pages.page_key(request)
        self.asked.add(key)
        if isinstance(result, UnchangedPage):
            return self.kept[key].page.model_copy(update={"served_at": result.served_at})
        self.read[key] = result
        return result


def _list(source: SweepSource, executor: RetryExecutor, bounds: SweepBounds, deadline: float, report: SweepReport,
          listing: _Listing, on_page: Callable[[SweepReport], None] | None,
          ) -> tuple[dict[str, datetime], datetime | None]:
    """The listed issues' newest update times, and the provider's clock at the first page."""
    listed: dict[str, datetime] = {}
    provider_started: datetime | None = None
    cursor = None
    while True:
        if report.pages >= bounds.max_pages or time.monotonic() >= deadline:
            report.outcome = "partial"
            report.detail = (f"stopped after {report.pages} pages (the sweep's page bound)" if report.pages >=
                             bounds.max_pages else f"stopped after {bounds.time_budget_s:.0f}s (the time budget)")
            return listed, provider_started
        request = listing.request(cursor)
        result, log = executor.list_identities(source, request)
        report.calls += log.attempts
        if isinstance(result, FetchFailure):
            report.outcome = "failed"
            report.detail = one_line(f"listing: {result.reason}: {result.detail}", 300)
            return listed, provider_started
        report.unchanged_pages += isinstance(result, UnchangedPage)
        result = listing.answer(request, result)
        report.pages += 1
        provider_started = provider_started or result.served_at
        report.excluded += result.excluded
        for identity in result.identities:
            # an issue listed twice (its position moved under the walk) counts once, at its newest time
            previous = listed.get(identity.external_ref)
            if previous is None or identity.external_updated_at > previous:
                listed[identity.external_ref] = identity.external_updated_at
        report.listed = len(listed)
        if on_page is not None:
            on_page(report)
        if result.next_cursor is None:
            listing.to_the_end = True
            return listed, provider_started
        cursor = result.next_cursor


_GAPS = f"""
WITH listed AS (
    SELECT * FROM unnest(%(refs)s::text[], %(times)s::timestamptz[]) AS l(external_ref, updated_at)
), compared AS (
    SELECT l.external_ref, l.updated_at,
           CASE WHEN c.ticket_id IS NULL THEN 'missing' ELSE 'stale' END AS reason,
           c.ticket_id,
           (SELECT max(o.source_updated_at) FROM ticket_observations o WHERE o.ticket_id = c.ticket_id) AS observed
      FROM listed l
      LEFT JOIN ticket_custody_links c
        ON (c.tenant, c.registration_key, c.external_ref) = (%(tenant)s, %(key)s, l.external_ref)
)
SELECT g.external_ref, g.updated_at, g.reason
  FROM compared g
 WHERE (g.ticket_id IS NULL OR g.observed IS NULL OR g.observed < g.updated_at)
   AND NOT EXISTS (  -- a version on its way: its receipt is not routed yet, or its work is unfinished
        SELECT 1 FROM ingress_receipts r
         WHERE r.registration_id = %(rid)s AND r.correlation ->> 'external_ref' = g.external_ref
           AND r.received_at >= g.updated_at
           AND (r.routing_status IN ('pending', 'routing')
                OR EXISTS (SELECT 1 FROM connector_outbox_events e JOIN connector_work_items w USING (event_id)
                            WHERE e.receipt_id = r.receipt_id AND w.state IN {sql_in(UNFINISHED)})))
 ORDER BY g.external_ref
"""


def _gaps(conn: Connection, registration: Registration, listed: dict[str, datetime]) -> list[Gap]:
    if not listed:
        return []
    rows = conn.execute(_GAPS, {"refs": list(listed), "times": list(listed.values()), "tenant": registration.tenant,
                                "key": registration.key, "rid": registration.registration_id}).fetchall()
    return [Gap(*row) for row in rows]


def _reobserve(conn: Connection, registration: Registration, source: SweepSource, executor: RetryExecutor,
               report: SweepReport, deadline: float, claim_lease: Callable[[], store.PollClaim | None]) -> None:
    """Read each gap in full, then admit the versions under the poll lease, compared again."""
    versions, version = [], IssueVersions(registration)
    for gap in report.gaps:
        if time.monotonic() >= deadline:
            report.outcome, report.detail = "partial", "the time budget ended while reading gaps; the next sweep " \
                                                       "reads the rest"
            break
        result, log = executor.fetch_issue(source, FetchIssue(external_ref=gap.external_ref))
        report.calls += log.attempts
        if isinstance(result, FetchFailure):
            report.outcome = "failed"
            report.detail = one_line(f"reading {gap.external_ref}: {result.reason}: {result.detail}", 300)
            break
        if result.issue is not None:  # gone or excluded since the listing: nothing to observe
            versions.append(version(result.issue))
    if not versions:
        return
    claim = claim_lease()
    if claim is None:
        report.outcome, report.detail = "lease_busy", "a poll held the registration's lease throughout"
        return
    try:
        with conn.transaction():
            still = {g.external_ref for g in _gaps(conn, registration, {v.external_ref: v.updated_at
                                                                         for v in versions})}
            report.reobserved = store.admit_versions(
                conn, claim, [_swept(v) for v in versions if v.external_ref in still],
                namespace=f"{SWEEP_NAMESPACE}:{uuid.uuid4().hex[:12]}")
    except store.PollLeaseLost as exc:
        report.outcome, report.detail = "lease_busy", one_line(str(exc), 300)
    finally:
        store.release(conn, claim)


def _swept(version: store.IssueVersion) -> store.IssueVersion:
    """The same receipt body a poll writes, marked so the observation opens a sweep-gap finding."""
    body = {**version.body, SWEPT_MARK: True}
    return store.IssueVersion(version.external_ref, version.updated_at, version.digest, canonical_json(body))


def _claim(conn: Connection, registry: ConnectorRegistry, registration: Registration, owner: str, wait_s: float,
           sleep: Callable[[float], None]) -> store.PollClaim | None:
    deadline = time.monotonic() + wait_s
    while True:
        claim = store.claim_now(conn, registry, registration.registration_id, owner=owner,
                                ttl=timedelta(seconds=60))
        if claim is not None or time.monotonic() >= deadline:
            return claim
        sleep(0.5)


def _record(conn: Connection, registration: Registration, report: SweepReport, started: datetime,
            listing: _Listing) -> None:
    reobserved = set(report.reobserved)
    with conn.transaction():
        # the pages read are kept whatever became of the sweep after them; a complete listing
        # also forgets the pages it no longer has
        sweep_pages.save(conn, registration, listing.read, keep_only=listing.asked if listing.to_the_end else None)
        (report.sweep_id,) = conn.execute(
            """INSERT INTO connector_sweeps (tenant, registration_key, revision_id, outcome, listed, excluded, gaps,
                                             reobserved, pages, unchanged_pages, calls, detail, started_at)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING sweep_id""",
            (registration.tenant, registration.key, registration.revision_id, report.outcome, report.listed,
             report.excluded, len(report.gaps), len(reobserved), report.pages, report.unchanged_pages, report.calls,
             report.detail, started),
        ).fetchone()
        if report.gaps:
            conn.execute(
                """INSERT INTO connector_sweep_gaps (sweep_id, external_ref, listed_updated_at, reason, reobserved)
                   SELECT %s, * FROM unnest(%s::text[], %s::timestamptz[], %s::text[], %s::boolean[])""",
                (report.sweep_id, [g.external_ref for g in report.gaps], [g.listed_updated_at for g in report.gaps],
                 [g.reason for g in report.gaps], [g.external_ref in reobserved for g in report.gaps]),
            )


@dataclass(frozen=True)
class LatestSweep:
    registration_id: str
    sweep_id: int
    outcome: str
    listed: int
    gaps: int
    reobserved: int
    calls: int
    finished_at: datetime


def latest_sweeps(conn: Connection) -> dict[str, LatestSweep]:
    """The newest sweep of every registration that has one."""
    rows = conn.execute(
        """SELECT DISTINCT ON (tenant, registration_key) tenant || '/' || registration_key, sweep_id, outcome, listed,
                  gaps, reobserved, calls, finished_at
             FROM connector_sweeps ORDER BY tenant, registration_key, sweep_id DESC""").fetchall()
    return {row[0]: LatestSweep(*row) for row in rows}
