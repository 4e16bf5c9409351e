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
from datetime import UTC, datetime, timedelta

PREFIX = "gl1"
_FORMAT = re.compile(r"^gl1;n=(\d{1,12});since=([^;]+);from=([^;]+);hwm=([^;]+);next=(.+)$")
_NONE = "-"
SCAN_OVERLAP = timedelta(seconds=1)


class CursorError(ValueError):
    pass


def format_time(value: datetime | None) -> str:
    if value is None:
        return _NONE
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse_time(value: str) -> datetime | None:
    if value == _NONE:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise CursorError(f"cursor time {value!r} is not ISO 8601") from None
    if moment.tzinfo is None:
        raise CursorError("cursor times carry a zone")
    return moment


@dataclass(frozen=True)
class GitLabCursor:
    seq: int = 0
    since: datetime | None = None
    scan_from: datetime | None = None
    hwm: datetime | None = None
    next: str | None = None  # path and query of the next keyset page, or None at a scan's start

    def encode(self) -> str:
        return (f"{PREFIX};n={self.seq};since={format_time(self.since)};from={format_time(self.scan_from)};"
                f"hwm={format_time(self.hwm)};next={self.next or _NONE}")

    @classmethod
    def decode(cls, token: str | None) -> GitLabCursor:
        if token is None:
            return cls()
        match = _FORMAT.match(token)
        if not match:
            raise CursorError("not a GitLab cursor token")
        seq, since, scan_from, hwm, nxt = match.groups()
        if nxt != _NONE and not nxt.startswith("/"):
            raise CursorError("the next link of a GitLab cursor is a path")
        return cls(int(seq), _parse_time(since), _parse_time(scan_from), _parse_time(hwm),
                   None if nxt == _NONE else nxt)

    def after_page(self, *, page_max: datetime | None, served_at: datetime | None, next_link: str | None) -> GitLabCursor:
        """The token after one page of this scan (a new scan ends when `next_link` is None)."""
        scan_from = self.scan_from if self.next is not None else served_at
        hwm = max((t for t in (self.hwm, page_max) if t is not None), default=None)
        if next_link is not None:
            return replace(self, seq=self.seq + 1, scan_from=scan_from, hwm=hwm, next=next_link)
        bounds = [t for t in (hwm, scan_from) if t is not None]
        since = min(bounds) - SCAN_OVERLAP if bounds else self.since
        if self.since is not None and since is not None and since < self.since:
            since = self.since  # the lower bound never moves back past where this scan began
        return GitLabCursor(seq=self.seq + 1, since=since)
