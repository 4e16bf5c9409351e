"""What providers' time-ordered scan cursors share: the token's time text and the rule for
where the next scan starts. Not core: each provider still owns, encodes and interprets its
own token (CX-04); these are the provider-neutral parts of that work.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

NONE = "-"  # an absent field in a token


class CursorError(ValueError):
    """A token this connector did not write (or that was corrupted)."""


def format_time(value: datetime | None, *, timespec: str = "milliseconds") -> str:
    if value is None:
        return NONE
    return value.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def parse_time(value: str) -> datetime | None:
    if value == NONE:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise CursorError(f"cursor time {value!r} is not ISO 8601") from None
    if moment.tzinfo is None:
        raise CursorError("cursor times carry a zone")
    return moment


def next_scan_since(since: datetime | None, hwm: datetime | None, scan_from: datetime | None, *,
                    overlap: timedelta, granularity: Callable[[datetime], datetime] = lambda t: t) -> datetime | None:
    """Where the next scan starts: min(newest update seen, provider time the scan began), at the
    provider's granularity, minus `overlap`; never before the current scan's lower bound."""
    bounds = [granularity(t) for t in (hwm, scan_from) if t is not None]
    start = min(bounds) - overlap if bounds else since
    if since is not None and start is not None and start < since:
        return since
    return start
