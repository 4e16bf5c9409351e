"""The GitLab cursor: a readable, bounded token only the GitLab adapter interprets
(docs/design/connector-contract.md, "Cursor rules").

`gl1;n=<seq>;since=<t>;from=<t>;hwm=<t>;next=<path?query>` where `since` is the
inclusive `updated_after` bound of the current query, `from` the provider's `Date` when
the scan's first page was served, `hwm` the newest `updated_at` seen in the scan, and
`next` the path of the next page to read. `n` grows with every page, so the token
always advances.

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
  the same page, so the page link is followed (a tie walk). Residual limit: during a
  tie walk, an issue of the run updated or deleted between two requests shifts the rest
  back one position, and the issue that moves onto the page already read (one of the
  run, or the first one after it) is skipped by this scan; the next scan reads it only
  if it is not older than its start.

The next scan starts at min(hwm, from) minus a second, never before `since`: never
later than the provider time at which this scan began, so a change that became visible
late is read again; the overlap writes nothing (receipts dedupe by version).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from nexus_pipelines.connectors.scan_cursor import (
    NONE,
    CursorError,
    format_time,
    next_scan_since,
    parse_time,
    reanchor,
)

PREFIX = "gl1"
_FORMAT = re.compile(r"^gl1;n=(\d{1,12});since=([^;]+);from=([^;]+);hwm=([^;]+);next=(.+)$")
SCAN_OVERLAP = timedelta(seconds=1)
KEYSET_PARAM = "cursor"  # a next link without it is an offset (page-number) link


@dataclass(frozen=True)
class GitLabCursor:
    seq: int = 0
    since: datetime | None = None
    scan_from: datetime | None = None
    hwm: datetime | None = None
    next: str | None = None  # path and query of the next page, or None at a scan's start

    def encode(self) -> str:
        return (f"{PREFIX};n={self.seq};since={format_time(self.since)};from={format_time(self.scan_from)};"
                f"hwm={format_time(self.hwm)};next={self.next or NONE}")

    @classmethod
    def decode(cls, token: str | None) -> GitLabCursor:
        if token is None:
            return cls()
        match = _FORMAT.match(token)
        if not match:
            raise CursorError("not a GitLab cursor token")
        seq, since, scan_from, hwm, nxt = match.groups()
        if nxt != NONE and not nxt.startswith("/"):
            raise CursorError("the next link of a GitLab cursor is a path")
        return cls(int(seq), parse_time(since), parse_time(scan_from), parse_time(hwm),
                   None if nxt == NONE else nxt)

    def after_page(self, *, updated: Sequence[datetime], served_at: datetime | None, next_link: str | None,
                   first_page: Callable[[datetime], str]) -> GitLabCursor:
        """The token after one page of this scan, whose items have the `updated` times in page
        order; the scan ends when `next_link` is None. `first_page(since)` is the path of the
        listing's first page from `since`."""
        scan_from = self.scan_from if self.next is not None else served_at
        hwm = max((t for t in (self.hwm, *updated) if t is not None), default=None)
        anchor = reanchor(next_link, updated[0] if updated else None, updated[-1] if updated else None,
                          keyset_param=KEYSET_PARAM, boundary=lambda last: last)
        if anchor is not None:  # an offset page: go on from a fresh first page, never skip
            return replace(self, seq=self.seq + 1, since=anchor, scan_from=scan_from, hwm=hwm,
                           next=first_page(anchor))
        if next_link is not None:
            return replace(self, seq=self.seq + 1, scan_from=scan_from, hwm=hwm, next=next_link)
        return GitLabCursor(seq=self.seq + 1, since=next_scan_since(self.since, hwm, scan_from, SCAN_OVERLAP))
