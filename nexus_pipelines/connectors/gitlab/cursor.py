"""The GitLab cursor: a readable, bounded token only the GitLab adapter interprets (CX-04).

`gl1;n=<seq>;since=<t>;from=<t>;hwm=<t>;next=<path?query>` where `since` is the
inclusive `updated_after` bound of the current scan, `from` the provider's `Date` when
the scan's first page was served, `hwm` the newest `updated_at` seen in the scan, and
`next` GitLab's keyset `rel="next"` link, followed exactly as given. Keyset pages are
ordered by (`updated_at`, `id`), so ties across page boundaries and issues updated
during the scan (they move past the position, and are read again later in the same
scan) are never skipped. The next scan starts at min(hwm, from) minus a second: never
later than the provider time at which this scan began, so a change that became
visible late is read again; the overlap writes nothing (receipts dedupe by version).
`n` grows with every page, so the token always advances.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from nexus_pipelines.connectors.scan_cursor import NONE, CursorError, format_time, next_scan_since, parse_time

PREFIX = "gl1"
_FORMAT = re.compile(r"^gl1;n=(\d{1,12});since=([^;]+);from=([^;]+);hwm=([^;]+);next=(.+)$")
SCAN_OVERLAP = timedelta(seconds=1)


@dataclass(frozen=True)
class GitLabCursor:
    seq: int = 0
    since: datetime | None = None
    scan_from: datetime | None = None
    hwm: datetime | None = None
    next: str | None = None  # path and query of the next keyset page, or None at a scan's start

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

    def after_page(self, *, page_max: datetime | None, served_at: datetime | None, next_link: str | None) -> GitLabCursor:
        """The token after one page of this scan (a new scan ends when `next_link` is None)."""
        scan_from = self.scan_from if self.next is not None else served_at
        hwm = max((t for t in (self.hwm, page_max) if t is not None), default=None)
        if next_link is not None:
            return replace(self, seq=self.seq + 1, scan_from=scan_from, hwm=hwm, next=next_link)
        return GitLabCursor(seq=self.seq + 1, since=next_scan_since(self.since, hwm, scan_from, SCAN_OVERLAP))
