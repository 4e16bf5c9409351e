"""The Jira cursor: a readable, bounded token only the Jira adapter interprets
(docs/design/connector-contract.md, "Cursor rules").

`jr1;n=<seq>;since=<t>;from=<t>;hwm=<t>;at=<t>[;a=<t>][;w=<watch>];next=<nextPageToken>`: `since`
is the scan's inclusive lower bound, `from` the provider's `Date` when the scan's first page
was served, `hwm` the newest `updated` seen in the scan, `at` the `Date` of the page that
issued `next`, `a` the bound the scan's current query was re-anchored at (absent: `since`),
and `next` Jira's `nextPageToken`, sent back exactly as given. A query is
`project = <id> [AND updated >= "<minute>"] ORDER BY updated ASC, id ASC`: ties on
`updated` (many issues inside one minute) are ordered by the immutable issue id.

JQL compares `updated` with a minute-granular literal, so a bound is floored to its
minute (inclusive, never later than meant). The next scan starts at min(hwm, from)
minus `SCAN_OVERLAP`, never before this scan's own bound: an issue updated while the
scan ran, or made searchable late (Jira's search is eventually consistent), is read
again. Re-read versions write nothing downstream. `n` grows with every page.

Atlassian documents `nextPageToken` as opaque, not as a keyset position, and a site's
token may hold an offset: an issue already read that is updated, deleted or moved out of
the project between two pages shifts the later ones back, and following the token skips
one whose `updated` may lie anywhere above the bound. So the scan follows the shared
rule for offset pages (`scan_cursor.page_step`, the token never counts as a keyset):
when a page's first issue is older than the earliest instant of its last issue's
minute, the scan goes on with a fresh query from that minute (`a`), which reads the
minute's issues again and skips nothing; only a page wholly inside one minute (a tie
run of at least a page) follows the token, and the next scan reads that run once more.
An issue stamped before the scan that the search index shows only during it appears
behind a followed token's position and shifts the later ones on: the page after brings
back the last issue of the page before (`w`, `scan_cursor.Watch`), and the scan repeats
from its own bound `since` (not the anchor: the late issue may be older) at once, at most
`MAX_SHIFT_RESTARTS` times, then at the next poll.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from nexus_pipelines.connectors.scan_cursor import (
    NONE,
    CursorError,
    Item,
    ScanToken,
    Watch,
    earliest,
    format_time,
    next_scan_since,
    page_step,
    parse_time,
    token_fields,
    watch_field,
)

PREFIX = "jr1"
_FORMAT = re.compile(r"^jr1;n=(\d{1,12});since=([^;]+);from=([^;]+);hwm=([^;]+);at=([^;]+)(?:;a=([^;]+))?(?:;w=([^;]+))?;next=(.+)$")
# At least the search index's lag: a change Jira had not made searchable yet is read next scan.
SCAN_OVERLAP = timedelta(minutes=1)
TOKEN_LIFETIME = timedelta(days=7)  # Jira: "This token will expire in 7 days."
JQL_ORDER = "ORDER BY updated ASC, id ASC"
_EARLIEST, _LATEST = datetime(1970, 1, 1, tzinfo=UTC), datetime(9000, 1, 1, tzinfo=UTC)  # any zone can show these


def _jql_wall_minute(bound: datetime, zone: ZoneInfo) -> tuple[datetime, tuple[datetime, datetime]]:
    """The latest wall-time minute in `zone` (naive) that means no instant after `bound`,
    whichever offset Jira picks for a wall time a daylight-saving change makes ambiguous, and
    the two instants it can mean (fold 0 and 1)."""
    local = bound.astimezone(zone).replace(second=0, microsecond=0, tzinfo=None)
    while True:
        meanings = tuple(local.replace(tzinfo=zone, fold=fold).astimezone(UTC) for fold in (0, 1))
        if max(meanings) <= bound:
            return local, meanings
        local -= timedelta(minutes=1)


def jql_minute(bound: datetime, zone: ZoneInfo) -> str:
    """`bound` as the `yyyy-MM-dd HH:mm` JQL literal (`_jql_wall_minute`)."""
    return _jql_wall_minute(bound, zone)[0].strftime("%Y-%m-%d %H:%M")


def earliest_meaning(bound: datetime | None, zone: ZoneInfo) -> datetime | None:
    """The earliest instant the JQL literal for `bound` can mean: Jira never answers an issue
    updated before it unless it read the literal in another time zone. (Taken from the wall
    minute itself, not its text read back: a scan asks this of every issue of a page.)"""
    if bound is None:
        return None
    return min(_jql_wall_minute(bound, zone)[1])


def scan_jql(project_id: int, since: datetime | None, zone: ZoneInfo) -> str:
    if since is None:
        return f"project = {project_id} {JQL_ORDER}"
    return f'project = {project_id} AND updated >= "{jql_minute(since, zone)}" {JQL_ORDER}'


@dataclass(frozen=True)
class JiraCursor(ScanToken):
    issued_at: datetime | None = None
    next: str | None = None  # Jira's nextPageToken, or None at a scan's start
    watch: Watch = Watch()
    anchor: datetime | None = None  # the bound of the current query once re-anchored, or None: `since`
    rescan: bool = field(default=False, compare=False)  # this token repeats a scan a shift made unsafe; not encoded

    def encode(self) -> str:
        return (f"{self.head(PREFIX, format_time)};at={format_time(self.issued_at)}"
                f"{f';a={format_time(self.anchor)}' if self.anchor else ''}{watch_field(self.watch)};"
                f"next={self.next or NONE}")

    @property
    def bound(self) -> datetime | None:
        """The lower bound of the query this token asks."""
        return self.anchor or self.since

    @property
    def at_scan_start(self) -> bool:
        return self.next is None and self.anchor is None

    @property
    def scan_goes_on(self) -> bool:
        """Whether the page that produced this token leaves the scan unfinished."""
        return not self.at_scan_start or self.watch.repeats

    @classmethod
    def decode(cls, token: str | None) -> JiraCursor:
        if token is None:
            return cls()
        seq, *times, anchor, watch, nxt = token_fields(_FORMAT, token, "Jira")
        since, scan_from, hwm, issued_at, anchor = (parse_time(t) for t in (*times, anchor or NONE))
        if any(t is not None and not _EARLIEST <= t < _LATEST for t in (since, scan_from, hwm, issued_at, anchor)):
            raise CursorError("a cursor time is out of range")
        return cls(int(seq), since, scan_from, hwm, issued_at, None if nxt == NONE else nxt, Watch.decode(watch),
                   anchor)

    def after_page(self, *, items: Sequence[Item], served_at: datetime | None,
                   next_token: str | None, zone: ZoneInfo) -> JiraCursor:
        """The token after one page of this scan, whose issues (id, `updated`) are in page order
        (the scan ends when `next_token` is None); `zone` is the one JQL minutes are read in."""
        scan_from = served_at if self.at_scan_start else self.scan_from
        hwm = self.newest(items)
        step = page_step(self.watch, items=items, served=served_at, next_link=next_token, keyset_param=None,
                         boundary=lambda last: earliest_meaning(last, zone), hwm=hwm)
        if step.kind == "shift":  # the same scan again, from its own bound: see above
            return JiraCursor(seq=self.seq + 1, since=self.since, watch=step.watch, rescan=True)
        if step.kind == "anchor":  # a fresh query from the last issue's minute: nothing skipped
            return replace(self, seq=self.seq + 1, scan_from=scan_from, hwm=hwm, issued_at=served_at, next=None,
                           anchor=step.anchor, watch=step.watch)
        if step.kind == "follow":
            return replace(self, seq=self.seq + 1, scan_from=scan_from, hwm=hwm, issued_at=served_at,
                           next=next_token, watch=step.watch)
        since = next_scan_since(self.since, hwm, scan_from, SCAN_OVERLAP)
        # a tie run the scan walked by token is read once more
        return JiraCursor(seq=self.seq + 1, since=earliest(since, step.anchor), watch=step.watch)

    def token_expired(self, served_at: datetime | None) -> bool:
        """Whether `next` had outlived Jira's token lifetime when a refusal was served."""
        return (self.next is not None and self.issued_at is not None and served_at is not None
                and served_at - self.issued_at >= TOKEN_LIFETIME)

    def restart(self) -> JiraCursor:
        """The same scan again from its own lower bound (nothing skipped; re-reads dedupe)."""
        return JiraCursor(seq=self.seq + 1, since=self.since)
