"""What every provider's cursor shares: its time fields' text form, the rule that picks
where the next scan starts, and the rule that keeps a walk over offset pages from
skipping anything (the connector-author guide, section 6).

Not core: core never reads a cursor. A provider's cursor module keeps its own prefix,
fields and paging; these are the parts that are the same everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl, urlsplit

NONE = "-"
# the earliest time a cursor holds: a scan starts an overlap before a time it saw, and that
# subtraction must stay inside datetime's range (no provider time is anywhere near this old)
EARLIEST = datetime.min.replace(tzinfo=UTC) + timedelta(days=1)


class CursorError(ValueError):
    pass


def format_time(value: datetime | None, timespec: str = "milliseconds") -> str:
    if value is None:
        return NONE
    return value.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def holdable(moment: datetime) -> bool:
    """Whether a zoned `moment` is a time a cursor can hold: one UTC datetime, from EARLIEST on
    (31 Dec 9999 23:59 -01:00 is in the year 10000, 1 Jan 0001 00:00 +01:00 in the year 0)."""
    try:
        return moment.astimezone(UTC) >= EARLIEST
    except OverflowError:
        return False


def parse_time(value: str) -> datetime | None:
    if value == NONE:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise CursorError(f"cursor time {value!r} is not ISO 8601") from None
    if moment.tzinfo is None:
        raise CursorError("cursor times carry a zone")
    if not holdable(moment):
        raise CursorError(f"cursor time {value!r} is out of range")
    return moment


def next_scan_since(since: datetime | None, hwm: datetime | None, scan_from: datetime | None,
                    overlap: timedelta) -> datetime | None:
    """min(highest update seen, provider time the scan began) minus the overlap, never
    before the finished scan's own lower bound (so nothing it could have missed is skipped)."""
    bounds = [t for t in (hwm, scan_from) if t is not None]
    if not bounds:
        return since
    start = min(bounds) - overlap
    return since if since is not None and start < since else start


def is_keyset_link(link: str, keyset_param: str) -> bool:
    """Whether a next link carries the provider's keyset position (GitHub `after=`, GitLab
    `cursor=`); any other next link is an offset (page-number) link."""
    return any(name == keyset_param for name, _ in parse_qsl(urlsplit(link).query, keep_blank_values=True))


def reanchor(next_link: str | None, first: datetime | None, last: datetime | None, *, keyset_param: str,
             boundary: Callable[[datetime], datetime]) -> datetime | None:
    """Where the scan goes on with a fresh first page instead of following `next_link`, or
    None to follow `next_link` exactly as given.

    On offset pages an update or deletion between two requests shifts later items back one
    position, so following the page link can skip an issue older than anything the next
    scan reads again. A page's own items are consistent, so everything before
    `boundary(last)` (the earliest time the last item's position can be asked for again:
    the provider's lower bound for it, widened by its granularity) has been read, and a
    first page from there skips nothing: a page whose first item is older than that bound
    re-anchors there. The anchor strictly increases (a first page from an anchor holds
    nothing older), so a chain of first pages ends. A page that lies wholly inside the
    window is a tie run of at least a page: a first page from its bound would be the same
    page, so the offset link is followed (a tie walk). Keyset links and the scan's end are
    followed as given.
    """
    if next_link is None or first is None or last is None or is_keyset_link(next_link, keyset_param):
        return None
    anchor = boundary(last)
    return anchor if first < anchor else None
