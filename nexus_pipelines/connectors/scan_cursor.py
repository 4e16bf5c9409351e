"""What every provider's cursor shares: its time fields' text form, the rule that picks
where the next scan starts, and the rule that keeps a walk over offset pages from
skipping anything (the connector-author guide, section 6).

Not core: core never reads a cursor. A provider's cursor module keeps its own prefix,
fields and paging; these are the parts that are the same everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
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


@dataclass(frozen=True)
class ScanToken:
    """The fields every provider's cursor token starts with, in this order:
    `<prefix>;n=<seq>;since=<t>;from=<t>;hwm=<t>`. `n` grows with every page (so the token
    always advances), `since` is the scan's lower bound, `from` the provider's `Date` when
    the scan's first page was served and `hwm` the newest update the scan saw. A provider's
    cursor adds its own fields after these, and keeps its own prefix and pattern."""

    seq: int = 0
    since: datetime | None = None
    scan_from: datetime | None = None
    hwm: datetime | None = None

    def head(self, prefix: str, form: Callable[[datetime | None], str]) -> str:
        """The token's leading fields, its times in the provider's `form`."""
        return f"{prefix};n={self.seq};since={form(self.since)};from={form(self.scan_from)};hwm={form(self.hwm)}"

    def newest(self, items: Sequence[Item]) -> datetime | None:
        """The scan's high-water mark once it has also read `items`."""
        return max((t for t in (self.hwm, *(at for _, at in items)) if t is not None), default=None)


def token_fields(pattern: re.Pattern[str], token: str, provider: str) -> tuple[str | None, ...]:
    """The fields of a provider's cursor token, as `pattern` groups them."""
    match = pattern.match(token)
    if not match:
        raise CursorError(f"not a {provider} cursor token")
    return match.groups()


def next_path(field: str, provider: str) -> str | None:
    """A token's `next` field read as the path of the next page (None at a scan's start): a
    path, so the page is always asked of the configured API."""
    if field == NONE:
        return None
    if not field.startswith("/"):
        raise CursorError(f"the next link of a {provider} cursor is a path")
    return field


def watch_field(watch: Watch) -> str:
    """A token's optional `;w=<watch>` field: empty when the watch has nothing to remember."""
    encoded = watch.encode()
    return f";w={encoded}" if encoded else ""


def is_keyset_link(link: str, keyset_param: str | None) -> bool:
    """Whether a next link carries the provider's keyset position (GitHub `after=`, GitLab
    `cursor=`); any other next link is an offset (page-number) link, and so is every opaque
    page token that may hold an offset (`keyset_param` None: Jira's `nextPageToken`)."""
    return keyset_param is not None and any(name == keyset_param for name, _ in parse_qsl(urlsplit(link).query, keep_blank_values=True))


def reanchor(next_link: str | None, first: datetime | None, last: datetime | None, *, keyset_param: str | None,
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


# -- shifts: what a scan remembers so that a shift under its pages loses nothing ----------

MAX_SHIFT_RESTARTS = 2  # a scan repeats at most this often in one poll; the next poll repeats it again
MAX_COUNTED_ROWS = 999_999  # a scan's walked rows are counted up to this
# the row fields (the last seven) are absent from a cursor written before they were counted
_WATCH = re.compile(r"^(\d{1,24}|-),([^,]+),(\d{1,4}),([^,]+),([^,]+),([^,]+),([^,]+),(\d)"
                    r"(?:,(\d{1,6}),([^,]+),(\d{1,6}),([^,]+),([^,]+),(\d{1,6}),(\d{1,6}))?$")
Item = tuple[str, datetime]  # a listed item's immutable id and update time: the version a page shows


@dataclass(frozen=True)
class Watch:
    """The part of a cursor that keeps shifts from losing an issue (the connector-author guide,
    section 6). On offset pages (and behind an opaque page token that may hold an offset) an
    edit, deletion or late-visible issue between two requests shifts later items by one:

    * back (an item already read moved away): the item that moves onto a read page is
      skipped. Re-anchored pages cannot skip (`reanchor`), but a tie walk can; so the
      next scan starts no later than the first tie run walked and reads it once more. A
      walk that was itself a re-read (its bound at or before `upto`) is read again only
      if it can have shifted back: an update was stamped after the walk began, or the
      scan did not list the windows its walks crossed as the scan it re-reads did
      (`prior`: that scan's first and last walk bound and the rows between; a deletion or
      a move out of the listing stamps no update, but the rows it shifted come back
      fewer; a re-read with no count to compare is read once more, with its own). Rows
      only leave past windows so often, so a re-read of unchanged runs ends.
    * forward (an item appeared before the position): the previous page's last item comes
      back in the same version (`last`: seen twice), or a page is shorter than the scan's pages before it
      (`size`: what the provider honours, which may be less than asked) though more follow;
      either is proof of a shift, and the scan repeats from its own lower bound, at most
      `MAX_SHIFT_RESTARTS` times in one poll (each costs the pages read so far); past that
      the scan ends where it began, so the next poll repeats it and the cursor never moves
      past what might have been skipped. `restarts` counts the repeats of this scan.
    """

    last: Item | None = None  # the last item of the page whose offset link was followed
    size: int = 0  # the longest page of this scan that more pages followed
    walk: datetime | None = None  # the bound of this scan's first tie walk
    walk_from: datetime | None = None  # the provider time that walk began
    owed: datetime | None = None  # the bound of the first tie walk that is no re-read: read it again
    upto: datetime | None = None  # tie walks at or before this bound re-read the previous scan's
    restarts: int = 0
    walk_rows: int = 0  # the rows this scan listed in the windows from `walk` to `walk_to`, each once
    walk_to: datetime | None = None  # the bound of the last page whose offset link a walk of this scan followed
    pending: int = 0  # the rows listed past `walk_to` since: `walk_rows` if a later walk page comes
    prior: datetime | None = None  # `walk` of the walk this scan re-reads, as the scan before walked it
    prior_to: datetime | None = None  # and its `walk_to`
    prior_rows: int = 0  # and its `walk_rows`
    again_rows: int = 0  # the rows this scan listed in the windows from `prior` to `prior_to`, each once

    def encode(self) -> str | None:
        """The cursor field, or None when there is nothing to remember."""
        if self == Watch():
            return None
        last_id, last_at = self.last or (NONE, None)
        times = (format_time(t) for t in (self.walk, self.walk_from, self.owed, self.upto))
        return ",".join((last_id, format_time(last_at, "microseconds"), str(self.size), *times, str(self.restarts),
                         str(self.walk_rows), format_time(self.walk_to), str(self.pending),
                         format_time(self.prior), format_time(self.prior_to), str(self.prior_rows),
                         str(self.again_rows)))

    @classmethod
    def decode(cls, text: str | None) -> Watch:
        if text is None:
            return cls()
        match = _WATCH.match(text)
        if not match:
            raise CursorError("the shift field of a cursor is not well formed")
        (last_id, last_at, size, *times, restarts, walk_rows, walk_to, pending, prior, prior_to, prior_rows,
         again_rows) = match.groups()
        at, walk, walk_from, owed, upto, walk_to, prior, prior_to = (
            parse_time(t) for t in (last_at, *times, walk_to or NONE, prior or NONE, prior_to or NONE))
        if (last_id == NONE) != (at is None):
            raise CursorError("the shift field of a cursor has half an item")
        if int(restarts) > MAX_SHIFT_RESTARTS:
            raise CursorError("a cursor counts more shift restarts than a poll makes")
        if ((walk_to is None and (int(walk_rows or 0) or int(pending or 0)))
                or ((prior is None or prior_to is None) and (int(prior_rows or 0) or int(again_rows or 0)))):
            raise CursorError("the shift field of a cursor counts the rows of no walk")
        last = None if at is None else (last_id, at)
        return cls(last, int(size), walk, walk_from, owed, upto, int(restarts), int(walk_rows or 0), walk_to,
                   int(pending or 0), prior, prior_to, int(prior_rows or 0), int(again_rows or 0))

    def shift_seen(self, items: Sequence[Item], more: bool) -> bool:
        """Whether this page, reached by an offset link or an opaque token (a first page and a
        keyset page are consistent), proves a shift: the last item of the page before it is
        here again in the same version (an edited one has moved on, which is no shift), or
        the page is shorter than the scan's pages before it though more follow."""
        return self.last is not None and (self.last in items or (more and len(items) < self.size))

    def paged(self, items: Sequence[Item], more: bool) -> Watch:
        """After a page that was no shift: the page size the provider honours."""
        return replace(self, size=min(max(self.size, len(items)), 9999)) if more else self

    def after_shift(self) -> Watch:
        """The watch of the same scan repeated from its own lower bound: at once (`repeats`) up to
        `MAX_SHIFT_RESTARTS` times, then at the next poll."""
        again = Watch(upto=self.upto, prior=self.prior, prior_to=self.prior_to, prior_rows=self.prior_rows)
        return replace(again, restarts=self.restarts + 1) if self.restarts < MAX_SHIFT_RESTARTS else again

    @property
    def repeats(self) -> bool:
        """Whether a scan start with this watch repeats a shifted scan in the same poll."""
        return self.restarts > 0

    def followed(self, items: Sequence[Item]) -> Watch:
        """After following an offset link (or an opaque token) from a page of these items."""
        last = items[-1] if items else None
        keep = last is not None and last[0].isascii() and last[0].isdigit() and len(last[0]) <= 24
        return replace(self, last=last if keep else None)

    def walked(self, bound: datetime, served: datetime | None, items: Sequence[Item]) -> Watch:
        """After following the offset link of a page wholly inside a tie run from `bound`."""
        owed = self.owed if self.owed is not None or (self.upto is not None and bound <= self.upto) else bound
        return replace(self.followed(items), walk=self.walk or bound, walk_from=self.walk_from or served, owed=owed)

    def counted(self, items: Sequence[Item], boundary: Callable[[datetime], datetime], *,
                walked_to: datetime | None = None, anchor: datetime | None = None) -> Watch:
        """After a page of this scan: its rows, each counted once (those a fresh first page
        from `anchor` lists again are left to that page), in the windows of the walk this
        scan re-reads (`again_rows`) and from this scan's first walk on (`walk_rows` up to
        the last walk page's bound; rows past it wait in `pending` until a later walk page,
        `walked_to` its bound, takes them in, since pages come in update order)."""
        if self.prior is None and self.walk is None:
            return self  # no window to count in: no row's boundary is taken (Jira's costs a zone lookup)
        rows = [b for b in (boundary(at) for _, at in items) if anchor is None or b < anchor]
        watch = self
        if self.prior is not None:
            again = sum(1 for b in rows if self.prior <= b <= self.prior_to)
            watch = replace(watch, again_rows=_capped(self.again_rows + again))
        if self.walk is None:
            return watch
        ours = [b for b in rows if b >= self.walk]
        if walked_to is not None:  # every row of a walk page is inside its bound
            return replace(watch, walk_rows=_capped(self.walk_rows + self.pending + len(ours)), walk_to=walked_to,
                           pending=0)
        inside = sum(1 for b in ours if b <= self.walk_to)
        return replace(watch, walk_rows=_capped(self.walk_rows + inside),
                       pending=_capped(self.pending + len(ours) - inside))

    def left(self) -> Watch:
        """After a fresh first page or a keyset link: no offset position to check."""
        return replace(self, last=None)

    def next_scan(self, hwm: datetime | None) -> tuple[datetime | None, Watch]:
        """Once this scan is done: the latest time the next scan may start at (None: where the
        other rules say) and its watch. A walk's bound is never before the scan's own bound."""
        reread = self.owed
        if self.walk is not None and hwm is not None and self.walk_from is not None and hwm >= self.walk_from:
            reread = self.walk  # an update stamped during a walk may have shifted it back
        if self._rereads_unlike_before:
            reread = self.walk  # a deletion during the walk may have shifted it back
        if reread is None:
            return None, Watch()
        # a later walk owed behind a re-read that is read again stays owed: its rows come with its own re-read
        upto = self.upto if self.owed not in (None, reread) else hwm
        if reread != self.walk:  # a later walk: its rows were not counted, so its re-read is read once more
            return reread, Watch(upto=upto)
        return reread, Watch(upto=upto, prior=self.walk, prior_to=self.walk_to, prior_rows=self.walk_rows)

    @property
    def _rereads_unlike_before(self) -> bool:
        """Whether this scan's first walk re-read a walk (the walk owed is another or none) but
        did not list that walk's windows as the scan before did: fewer rows, or no count
        of them to compare."""
        if self.walk is None or self.owed == self.walk:
            return False
        return self.prior != self.walk or self.again_rows < self.prior_rows


def _capped(rows: int) -> int:
    return min(rows, MAX_COUNTED_ROWS)


@dataclass(frozen=True)
class Step:
    """What a scan over linked pages does after one page: `shift` (repeat the scan from its own
    bound with `watch`), `anchor` (a fresh first page from `anchor`), `follow` (the next link
    as given) or `end` (the scan is done; the next one starts no later than `anchor` when set)."""

    kind: str
    watch: Watch
    anchor: datetime | None = None


def page_step(watch: Watch, *, items: Sequence[Item], served: datetime | None, next_link: str | None,
              keyset_param: str | None, boundary: Callable[[datetime], datetime], hwm: datetime | None) -> Step:
    """The one rule for a page of a scan over keyset or offset links (GitLab, GitHub) or opaque
    page tokens that may hold an offset (Jira: `next_link` is the token, `keyset_param` None), whose
    `items` are in page order: a shift repeats the scan; an offset page re-anchors
    (`reanchor`) unless it is a tie walk, which the watch remembers; `hwm` is the scan's
    newest update including this page."""
    more = next_link is not None
    if watch.shift_seen(items, more):
        return Step("shift", watch.after_shift())
    watch = watch.paged(items, more)
    first, last = (items[0][1], items[-1][1]) if items else (None, None)
    anchor = reanchor(next_link, first, last, keyset_param=keyset_param, boundary=boundary)
    if anchor is not None:
        return Step("anchor", watch.left().counted(items, boundary, anchor=anchor), anchor)
    if more:
        if last is not None and not is_keyset_link(next_link, keyset_param):  # a tie walk
            bound = boundary(last)
            return Step("follow", watch.walked(bound, served, items).counted(items, boundary, walked_to=bound))
        return Step("follow", watch.left().counted(items, boundary))
    reread, watch = watch.counted(items, boundary).next_scan(hwm)
    return Step("end", watch, reread)


def earliest(*moments: datetime | None) -> datetime | None:
    """The earliest of the known moments (None when none is known)."""
    return min((m for m in moments if m is not None), default=None)
