"""The GitHub cursor: a readable, bounded token only the GitHub adapter interprets
(docs/design/connector-contract.md, "Cursor rules").

`gh1;n=<seq>;since=<t>;from=<t>;hwm=<t>;etag=<etag>[;w=<watch>];next=<path?query>`

`w` is what the scan remembers against shifts (`scan_cursor.Watch`, absent when there is
nothing).

A scan lists `state=all&sort=updated&direction=asc` from the lower bound `since` and
walks GitHub's `Link rel="next"` URLs exactly as given (`next`); page numbers are never
built and never stored as the durable position. `from` is GitHub's `Date` when the
scan's first page was served and `hwm` the newest `updated_at` the scan saw (pull
requests included: the cursor advances past what it skips).

GitHub pages this listing in one of two ways, told apart by the next link:

* **Keyset** (the link carries `after=`, GitHub's opaque cursor over (updated time,
  issue id)): the immutable id breaks ties, so a page boundary inside a run of equal
  `updated_at` values skips nothing, and an issue updated mid-scan moves past the
  position and is read again later in the same scan. The link is followed as given.
* **Page numbers** (any other link, e.g. `page=2`, the form GitHub's pagination guide
  shows for this listing): an update or deletion between two requests shifts later
  items back one position, so following the link would skip one issue older than
  `hwm`, for good. The scan re-anchors instead (`scan_cursor.reanchor`): when the page's
  first item is older than its last item's whole second minus one second, `next`
  becomes the listing's first page (on the path of GitHub's own next link, which is
  `/repositories/<id>/issues`; the same parameters as a scan start, no `If-None-Match`) with `since` at that bound, and
  `since` becomes the anchor; everything before it was read from consistent first
  pages, and the scan goes on at once (it is not exhausted). The anchor strictly
  increases, so the chain of first pages ends; it costs about one re-read boundary
  item per page. A page wholly inside that two-second window is a tie run of at least a
  page: a first page from its bound would be the same page, so the page link is
  followed (a tie walk). During a tie walk an issue of the run updated or deleted
  between two requests shifts the rest back one position and the issue that moves onto
  the page already read is skipped by this scan, so the next scan starts no later than
  the run and reads it once more; a page that brings back the last issue of the page
  before (one appeared behind the position) or is short though more follow repeats the
  scan from `since` (`scan_cursor.page_step`). GitHub refuses page numbers 1,000 rows
  deep with 422 ("use cursor based pagination (after/before)"), so a tie run that long
  cannot be walked by page number: a refused page link goes on at a first page from
  `since` (everything before it was read) in the cursor form, with an empty `after=`
  (GitHub's way to ask for an initial cursor), whose `after=` links are keyset links
  and followed as given (`refused`). The run's first rows are read again once.

GitHub times are whole seconds and `since` is second-granular, so the next scan starts
a whole second before min(hwm, from), never before `since`: never later than the
provider time at which this scan began, and the boundary second is read again whether
GitHub's `since` is inclusive or not. The overlap writes nothing (receipts dedupe by
version).

`etag` is the ETag of the last scan's first page, kept only when that page was the
whole scan (it had no `rel="next"`) and the next scan starts at the same `since`: the
next scan sends it as `If-None-Match`, and a 304 (free of rate limit) ends an unchanged
poll after one call. A scan of several pages keeps none: its first page can stay
unchanged while later pages change (a tie run longer than a page keeps the next scan's
`since`, and updates land on later pages), so a 304 there would hide them forever.
`n` grows with every page, so the token always advances.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from nexus_pipelines.connectors.scan_cursor import (
    NONE,
    Item,
    ScanToken,
    Watch,
    earliest,
    is_keyset_link,
    next_path,
    next_scan_since,
    page_step,
    parse_time,
    token_fields,
    watch_field,
)
from nexus_pipelines.connectors.scan_cursor import format_time as format_seconds

PREFIX = "gh1"
_FORMAT = re.compile(r"^gh1;n=(\d{1,12});since=([^;]+);from=([^;]+);hwm=([^;]+);etag=([^;]+)(?:;w=([^;]+))?;next=(.+)$")
SCAN_OVERLAP = timedelta(seconds=1)
KEYSET_PARAM = "after"  # a next link without it is a page-number (offset) link


def format_time(value: datetime | None) -> str:
    """GitHub's ISO 8601 form, whole seconds (`since` is second-granular)."""
    return format_seconds(value, timespec="seconds")


def _whole_second(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC).replace(microsecond=0)


def boundary(last: datetime) -> datetime:
    """The `since` that asks for `last` again whether GitHub's `since` is inclusive or not:
    its whole second minus one."""
    return _whole_second(last) - timedelta(seconds=1)


@dataclass(frozen=True)
class GitHubCursor(ScanToken):
    etag: str | None = None
    next: str | None = None  # path and query of the next page, or None at a scan's start
    watch: Watch = Watch()
    rescan: bool = field(default=False, compare=False)  # this token repeats a scan a shift made unsafe; not encoded

    def encode(self) -> str:
        return (f"{self.head(PREFIX, format_time)};etag={self.etag or NONE}{watch_field(self.watch)};"
                f"next={self.next or NONE}")

    @classmethod
    def decode(cls, token: str | None) -> GitHubCursor:
        if token is None:
            return cls()
        seq, since, scan_from, hwm, etag, watch, nxt = token_fields(_FORMAT, token, "GitHub")
        nxt = next_path(nxt, "GitHub")
        return cls(int(seq), parse_time(since), parse_time(scan_from), parse_time(hwm),
                   None if etag == NONE else etag, nxt, Watch.decode(watch))

    @property
    def at_scan_start(self) -> bool:
        return self.next is None

    @property
    def scan_goes_on(self) -> bool:
        """Whether the page that produced this token leaves the scan unfinished."""
        return self.next is not None or self.watch.repeats

    def after_page(self, *, items: Sequence[Item], served: datetime | None, etag: str | None,
                   next_link: str | None, first_page: Callable[[datetime], str]) -> GitHubCursor:
        """The token after one page of this scan, whose items (number, `updated_at`; pull
        requests included) are in page order; the scan ends when `next_link` is None.
        `first_page(since)` is the path of the listing's first page from `since`."""
        scan_from = self.scan_from if not self.at_scan_start else served
        hwm = self.newest(items)
        step = page_step(self.watch, items=items, served=served, next_link=next_link,
                         keyset_param=KEYSET_PARAM, boundary=boundary, hwm=_whole_second(hwm))
        if step.kind == "shift":  # the same scan again, from its own bound
            return GitHubCursor(seq=self.seq + 1, since=self.since, watch=step.watch, rescan=True)
        if step.kind == "anchor":  # an offset page: go on from a fresh first page, never skip
            return replace(self, seq=self.seq + 1, since=step.anchor, scan_from=scan_from, hwm=hwm, etag=None,
                           next=first_page(step.anchor), watch=step.watch)
        if step.kind == "follow":
            return replace(self, seq=self.seq + 1, scan_from=scan_from, hwm=hwm, etag=None, next=next_link,
                           watch=step.watch)
        # a 304 to the first page proves nothing changed only when that page was the whole scan
        return self._next_scan(scan_from, hwm, etag if self.at_scan_start else None, step.anchor, step.watch)

    def _next_scan(self, scan_from: datetime | None, hwm: datetime | None, etag: str | None,
                   reread: datetime | None, watch: Watch) -> GitHubCursor:
        since = next_scan_since(self.since, _whole_second(hwm), _whole_second(scan_from), SCAN_OVERLAP)
        if since is not None:
            since = earliest(since, reread)  # a tie walk is read once more
        # the first page's ETag answers the same question only when the next scan asks it again
        return GitHubCursor(seq=self.seq + 1, since=since, etag=etag if since == self.since else None, watch=watch)

    def unchanged(self) -> GitHubCursor:
        """After a 304 to the scan's first page: nothing changed, the same question next time."""
        return GitHubCursor(seq=self.seq + 1, since=self.since, etag=self.etag, watch=self.watch)

    def refused(self, cursor_first_page: Callable[[datetime | None], str]) -> GitHubCursor:
        """GitHub refused the stored next link. A page-number link (too deep) goes on at
        `cursor_first_page(since)`, the listing's first page from `since` asking for cursor
        links; a refused `after=` link (expired or invalid, or a GitHub that gives no cursor
        form) ends this scan early: the next one starts no later than this one's start, its
        high-water mark and its walked tie run."""
        if self.next is not None and not is_keyset_link(self.next, KEYSET_PARAM):
            return replace(self, seq=self.seq + 1, etag=None, next=cursor_first_page(self.since),
                           watch=self.watch.left())
        return self._next_scan(self.scan_from, self.hwm, None, *self.watch.next_scan(_whole_second(self.hwm)))
