"""What every provider's cursor shares: its time fields' text form and the rule that picks
where the next scan starts (the connector-author guide, section 6).

Not core: core never reads a cursor. A provider's cursor module keeps its own prefix,
fields and paging; these are the parts that are the same everywhere.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

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
