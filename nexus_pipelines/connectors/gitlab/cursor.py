"""The GitLab cursor: a readable, bounded token only the GitLab adapter interprets
(docs/design/connector-contract.md, "Cursor rules").

`gl1;n=<seq>;since=<t>;from=<t>;hwm=<t>[;w=<watch>];next=<path?query>` where `since` is the
inclusive `updated_after` bound of the current query, `from` the provider's `Date` when
the scan's first page was served, `hwm` the newest `updated_at` seen in the scan, and
`next` the path of the next page to read, `w` what the scan remembers against shifts
(`scan_cursor.Watch`, absent when there is nothing). `n` grows with every page, so the
token always advances.

The adapter asks for `pagination=keyset`; what comes back is told apart by the next link:

* **Keyset** (the link carries `cursor=`): pages are ordered by (`updated_at`, `id`), so
  ties across page boundaries and issues updated during the scan (they move past the
  position, and are read again later in the same scan) are never skipped. The link is
  followed exactly as given.
* **Offset** (any other link: a GitLab that does not offer keyset pagination for issues
  ignores `pagination=keyset`, or refuses it with 405 and the adapter asks again without
  it, and answers `page=N` links with `x-page`/`x-next-page`):
  an update or deletion between two requests shifts later items back one position, so
  following the link would skip one issue older than `hwm`, for good. The scan
  re-anchors instead (`scan_cursor.reanchor`): when the page's first item is older than
  its last item, `next` becomes the listing's first page (a scan start's parameters,
  less `pagination=keyset`) with `updated_after` at the last item's `updated_at` (inclusive, millisecond
  precise, so the last item and its ties are read again), and `since` becomes that
  anchor; everything before it was read from consistent first pages, and the scan goes
  on at once (it is not exhausted). The anchor strictly increases, so the chain of first
  pages ends; it costs about one re-read boundary item per page. A page whose items all
  share one `updated_at` is a tie run of at least a page: a first page from it would be
  the same page, so the page link is followed (a tie walk). During a tie walk an issue
  of the run updated or deleted between two requests shifts the rest back one position
  and the issue that moves onto the page already read is skipped by this scan, so the
  next scan starts no later than the run and reads it once more; a page that brings
  back the last issue of the page before (one appeared behind the position) or is
  short though more follow repeats the scan from `since` (`scan_cursor.page_step`).

The next scan starts at min(hwm, from) minus a second (and no later than a walked tie
run), never before `since`: never later than the provider time at which this scan
began, so a change that became visible late is read again; the overlap writes nothing
(receipts dedupe by version).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from nexus_pipelines.connectors.scan_cursor import (
    NONE,
    Item,
    ScanToken,
    Watch,
    earliest,
    format_time,
    next_path,
    next_scan_since,
    page_step,
    parse_time,
    token_fields,
    watch_field,
)

PREFIX = "gl1"
_FORMAT = re.compile(r"^gl1;n=(\d{1,12});since=([^;]+);from=([^;]+);hwm=([^;]+)(?:;w=([^;]+))?;next=(.+)$")
SCAN_OVERLAP = timedelta(seconds=1)
KEYSET_PARAM = "cursor"  # a next link without it is an offset (page-number) link


@dataclass(frozen=True)
class GitLabCursor(ScanToken):
    next: str | None = None  # path and query of the next page, or None at a scan's start
    watch: Watch = Watch()
    rescan: bool = field(default=False, compare=False)  # this token repeats a scan a shift made unsafe; not encoded

    def encode(self) -> str:
        return f"{self.head(PREFIX, format_time)}{watch_field(self.watch)};next={self.next or NONE}"

    @property
    def scan_goes_on(self) -> bool:
        """Whether the page that produced this token leaves the scan unfinished."""
        return self.next is not None or self.watch.repeats

    @classmethod
    def decode(cls, token: str | None) -> GitLabCursor:
        if token is None:
            return cls()
        seq, since, scan_from, hwm, watch, nxt = token_fields(_FORMAT, token, "GitLab")
        nxt = next_path(nxt, "GitLab")
        return cls(int(seq), parse_time(since), parse_time(scan_from), parse_time(hwm), nxt, Watch.decode(watch))

    def after_page(self, *, items: Sequence[Item], served_at: datetime | None, next_link: str | None,
                   first_page: Callable[[datetime], str]) -> GitLabCursor:
        """The token after one page of this scan, whose items (iid, `updated_at`) are in page
        order; the scan ends when `next_link` is None. `first_page(since)` is the path of the
        listing's first page from `since`."""
        scan_from = self.scan_from if self.next is not None else served_at
        hwm = self.newest(items)
        step = page_step(self.watch, items=items, served=served_at, next_link=next_link,
                         keyset_param=KEYSET_PARAM, boundary=lambda t: t, hwm=hwm)
        if step.kind == "shift":  # the same scan again, from its own bound
            return GitLabCursor(seq=self.seq + 1, since=self.since, watch=step.watch, rescan=True)
        if step.kind == "anchor":  # an offset page: go on from a fresh first page, never skip
            return replace(self, seq=self.seq + 1, since=step.anchor, scan_from=scan_from, hwm=hwm,
                           next=first_page(step.anchor), watch=step.watch)
        if step.kind == "follow":
            return replace(self, seq=self.seq + 1, scan_from=scan_from, hwm=hwm, next=next_link, watch=step.watch)
        since = next_scan_since(self.since, hwm, scan_from, SCAN_OVERLAP)
        return GitLabCursor(seq=self.seq + 1, since=earliest(since, step.anchor) if since else None, watch=step.watch)
