"""The shared cursor rules every provider's cursor uses (scan_cursor.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_pipelines.connectors.gitlab.cursor import GitLabCursor
from nexus_pipelines.connectors.scan_cursor import (
    MAX_SHIFT_RESTARTS,
    CursorError,
    Watch,
    is_keyset_link,
    next_scan_since,
    page_step,
    reanchor,
)

T = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def exact(last):
    return last


def second_before(last):
    return last.replace(microsecond=0) - timedelta(seconds=1)


@pytest.mark.parametrize("link, keyset", [
    ("/repositories/1/issues?state=all&after=Y3Vyc29y&page=2", True),
    ("/repositories/1/issues?state=all&per_page=10&page=2", False),
    ("/api/v4/projects/1/issues?pagination=keyset&cursor=eyJrIjo&per_page=10", True),
    ("/api/v4/projects/1/issues?pagination=keyset&page=2&per_page=10", False),
    ("/repositories/1/issues?safter=x&page=2", False),  # the parameter, not a substring
    ("/repositories/1/issues?after=", True),
])
def test_a_keyset_link_is_told_apart_by_its_parameter(link, keyset):
    marker = "cursor" if "/api/v4/" in link else "after"
    assert is_keyset_link(link, marker) is keyset


def test_an_opaque_page_token_is_never_a_keyset_link_and_reanchors_like_an_offset_link():
    token = "/x?after=abc"  # whatever an opaque token (Jira's nextPageToken) happens to hold
    assert not is_keyset_link(token, None)
    last = T + timedelta(minutes=9)
    assert reanchor(token, T, last, keyset_param=None, boundary=exact) == last


def test_keyset_links_and_the_scan_end_are_followed_as_given():
    first, last = T, T + timedelta(minutes=9)
    assert reanchor("/x?after=abc", first, last, keyset_param="after", boundary=exact) is None
    assert reanchor(None, first, last, keyset_param="after", boundary=exact) is None
    assert reanchor("/x?page=2", None, None, keyset_param="after", boundary=exact) is None  # an empty page


def test_an_offset_page_older_than_its_boundary_window_reanchors_at_the_last_items_bound():
    assert reanchor("/x?page=2", T, T + timedelta(milliseconds=1), keyset_param="cursor",
                    boundary=exact) == T + timedelta(milliseconds=1)
    last = T + timedelta(seconds=2, milliseconds=500)
    assert reanchor("/x?page=2", T, last, keyset_param="after",
                    boundary=second_before) == T + timedelta(seconds=1)


@pytest.mark.parametrize("first_offset_s", [0.0, 0.5, 1.0, 1.9])
def test_a_page_inside_its_boundary_window_is_a_tie_walk_that_follows_the_offset_link(first_offset_s):
    # GitHub: the last item's whole second and the second before it are the window
    first, last = T + timedelta(seconds=first_offset_s), T + timedelta(seconds=1, milliseconds=999)
    assert reanchor("/x?page=2", first, last, keyset_param="after", boundary=second_before) is None
    assert reanchor("/x?page=2", T, T, keyset_param="cursor", boundary=exact) is None  # GitLab: one instant


def test_the_anchor_strictly_increases_along_a_chain_of_first_pages():
    # a fresh first page from an anchor holds nothing before it; its own anchor, if any, is later
    for boundary, step in ((exact, timedelta(milliseconds=1)), (second_before, timedelta(seconds=1))):
        anchor = T
        for _ in range(5):
            first, last = anchor, anchor + 3 * step
            new = reanchor("/x?page=2", first, last, keyset_param="after", boundary=boundary)
            assert new is not None and new > anchor
            anchor = new


def test_next_scan_since_is_unchanged():
    assert next_scan_since(None, T, T + timedelta(hours=1), timedelta(seconds=1)) == T - timedelta(seconds=1)
    assert next_scan_since(T, T - timedelta(hours=1), None, timedelta(seconds=1)) == T
    assert next_scan_since(T, None, None, timedelta(seconds=1)) == T


# -- shifts ------------------------------------------------------------------------------

def items(first: int, last: int, at: datetime = T) -> list[tuple[str, datetime]]:
    return [(str(n), at) for n in range(first, last + 1)]


PAGE = items(1, 10)


def test_a_watch_round_trips_and_a_token_without_one_still_decodes():
    watch = Watch(last=("42", T + timedelta(microseconds=7)), size=100, walk=T, walk_from=T + timedelta(minutes=5),
                  owed=T, upto=T + timedelta(minutes=6), restarts=1, walk_rows=250, walk_to=T + timedelta(seconds=2),
                  pending=4, prior=T, prior_to=T + timedelta(seconds=1), prior_rows=249, again_rows=7)
    assert Watch.decode(watch.encode()) == watch and Watch().encode() is None
    assert GitLabCursor.decode("gl1;n=3;since=-;from=-;hwm=-;next=-").watch == Watch()  # a token from before
    assert Watch.decode("-,-,0,-,-,-,2026-11-01T09:00:00Z,0") == Watch(upto=T)  # a watch from before rows were counted
    for bad in ("42,-,100,-,-,-,-,0", "-,2026-11-01T09:00:00Z,1,-,-,-,-,0", "x,-,1,-,-,-,-,0",
                "-,-,1,-,-,-,-," + str(MAX_SHIFT_RESTARTS + 1), "-,-,1,noon,-,-,-,0", "-,-,1,-,-,-,-",
                "-,-,1,-,-,-,-,0,0,-,0,-,-,7,0", "-,-,1,-,-,-,-,0,3,-,0,-,-,0,0", "-,-,1,-,-,-,-,0,0,-,2,-,-,0,0",
                "-,-,1,-,-,-,-,0,0,-,0,-,-,0,5", "-,-,1,-,-,-,-,0,0,-,0,2026-11-01T09:00:00Z,-,3,0",
                "-,-,1,-,-,-,-,0,0,-,0,-,-,0"):
        with pytest.raises(CursorError):
            Watch.decode(bad)


def test_the_last_item_read_again_behind_an_offset_link_is_a_shift():
    followed = Watch().paged(PAGE, True).followed(PAGE)
    assert followed.shift_seen([PAGE[-1], *PAGE[:9]], True)
    assert not followed.shift_seen(items(11, 20), True)
    assert not Watch().shift_seen(PAGE, True)  # a first page is consistent


def test_the_last_item_back_in_a_new_version_is_no_shift():
    followed = Watch().paged(PAGE, True).followed(PAGE)
    assert not followed.shift_seen([*items(11, 19), ("10", T + timedelta(seconds=1))], True)  # edited: moved on


def test_a_page_shorter_than_the_scans_pages_though_more_follow_is_a_shift_only_behind_an_offset_link():
    followed = Watch().paged(PAGE, True).followed(PAGE)
    short = items(11, 19)
    assert followed.shift_seen(short, True)
    assert not followed.shift_seen(short, False)  # the last page
    assert not Watch(size=10).shift_seen(short, True)  # a first page from an anchor, or a keyset page


def test_a_shift_repeats_the_scan_at_once_a_bounded_number_of_times_then_at_the_next_poll():
    watch, repeats = Watch(upto=T), 0
    while (watch := watch.after_shift()).repeats:
        repeats += 1
        assert watch.upto == T
    assert repeats == MAX_SHIFT_RESTARTS and watch == Watch(upto=T)


def walk(watch: Watch, bound: datetime, served: datetime, page=None) -> Watch:
    page = page or items(1, 10, bound)
    return page_step(watch, items=page, served=served, next_link="/x?page=2", keyset_param="cursor",
                     boundary=exact, hwm=bound).watch


def end(watch: Watch, page, hwm: datetime):
    """The last page of a scan: (where the next scan starts at the latest, its watch)."""
    step = page_step(watch, items=page, served=None, next_link=None, keyset_param="cursor", boundary=exact, hwm=hwm)
    return step.anchor, step.watch


AFTER = T + timedelta(minutes=9)
LAST_PAGE = [*items(11, 13), *items(14, 15, AFTER)]  # the run's last 3 rows, then 2 later ones


def test_a_tie_walk_is_owed_one_reread_by_the_next_scan_which_gets_its_rows():
    walked = walk(Watch(), T, T + timedelta(hours=1))
    assert walked.owed == T and walked.last == ("10", T) and (walked.walk_rows, walked.walk_to) == (10, T)
    assert end(walked, LAST_PAGE, AFTER) == (T, Watch(upto=AFTER, prior=T, prior_to=T, prior_rows=13))


def test_a_reread_walk_that_lists_its_windows_as_before_ends_unless_an_update_was_stamped_after_it_began():
    began = T + timedelta(hours=1)
    owed = Watch(upto=AFTER, prior=T, prior_to=T, prior_rows=13)
    reread = walk(owed, T, began)
    assert reread.owed is None
    assert end(reread, LAST_PAGE, AFTER) == (None, Watch())  # unchanged: done
    assert end(reread, LAST_PAGE, began + timedelta(seconds=1))[0] == T  # something changed while it was walked


def test_a_reread_walk_whose_windows_came_back_with_fewer_rows_is_read_again_until_they_come_back_as_many():
    began = T + timedelta(hours=1)
    owed = Watch(upto=AFTER, prior=T, prior_to=T, prior_rows=14)  # the scan before listed 14 rows there
    reread, watch = end(walk(owed, T, began), LAST_PAGE, AFTER)  # 13 now, and no update was stamped: a deletion?
    assert (reread, watch) == (T, Watch(upto=AFTER, prior=T, prior_to=T, prior_rows=13))
    assert end(walk(watch, T, began), LAST_PAGE, AFTER) == (None, Watch())  # as many as the last time: done


def test_a_reread_walk_with_no_count_of_its_windows_is_read_once_more_with_its_own():
    began = T + timedelta(hours=1)
    for owed in (Watch(upto=AFTER), Watch(upto=AFTER, prior=T - timedelta(minutes=1), prior_to=T, prior_rows=1)):
        reread, watch = end(walk(owed, T, began), LAST_PAGE, AFTER)
        assert (reread, watch) == (T, Watch(upto=AFTER, prior=T, prior_to=T, prior_rows=13))
        assert end(walk(watch, T, began), LAST_PAGE, AFTER) == (None, Watch())


def test_the_rows_from_the_first_walk_to_the_last_walk_page_are_each_counted_once():
    later = T + timedelta(seconds=1)
    chain = walk(walk(Watch(), T, T), later, T, page=items(11, 20, later))  # one walk across two windows
    assert (chain.walk, chain.walk_to, chain.walk_rows) == (T, later, 20)
    anchored = page_step(chain, items=[*items(21, 22, later), *items(23, 30, AFTER)], served=None,
                         next_link="/x?page=4", keyset_param="cursor", boundary=exact, hwm=AFTER)
    assert anchored.kind == "anchor" and (anchored.watch.walk_rows, anchored.watch.pending) == (22, 0)  # 23-30 again
    again = walk(anchored.watch, AFTER, T, page=items(23, 32, AFTER))  # a later walk: its rows count too
    assert (again.walk_to, again.walk_rows) == (AFTER, 32)
    beyond = T + timedelta(hours=2)
    assert end(again, [*items(33, 34, AFTER), *items(35, 36, beyond)], beyond) == (
        T, Watch(upto=beyond, prior=T, prior_to=AFTER, prior_rows=34))  # the rows past the last walk page wait


def _reread_then_a_later_walk(prior_rows: int) -> Watch:
    """A re-read of the walk at T (its windows counted 11 rows now), then a new walk at AFTER."""
    began = T + timedelta(hours=1)
    reread = walk(Watch(upto=T, prior=T, prior_to=T, prior_rows=prior_rows), T, began)
    ended = page_step(reread, items=[*items(11, 11), *items(12, 20, AFTER)], served=None, next_link="/x?page=3",
                      keyset_param="cursor", boundary=exact, hwm=AFTER)  # the re-read run ends, anchored
    watch = walk(ended.watch, AFTER, began, page=items(21, 30, AFTER))
    assert (watch.walk, watch.owed, watch.again_rows) == (T, AFTER, 11)
    return watch


def test_a_later_tie_walk_than_the_reread_is_owed_its_own_reread_which_is_then_read_once_more_with_its_rows():
    watch = _reread_then_a_later_walk(prior_rows=11)
    assert end(watch, items(31, 31, AFTER), AFTER) == (AFTER, Watch(upto=AFTER))  # its rows from AFTER: not counted


def test_a_later_walk_owed_behind_a_reread_that_is_read_again_stays_owed():
    watch = _reread_then_a_later_walk(prior_rows=12)  # the re-read's windows came back with fewer rows
    assert end(watch, items(31, 31, AFTER), AFTER) == (
        T, Watch(upto=T, prior=T, prior_to=AFTER, prior_rows=22))  # AFTER is past upto: still owed next time


_FIELD = st.just("-") | st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e, exclude_characters=","),
                                min_size=1, max_size=30)
_TIME = st.just("-") | st.datetimes(timezones=st.timezones()).map(datetime.isoformat) | _FIELD
_COUNT = st.integers(min_value=0, max_value=10**7) | _FIELD
_WATCH_LIKE = st.builds("{},{},{},{},{},{},{},{}{}".format, st.integers(min_value=0, max_value=10**30) | _FIELD, _TIME,
                        st.integers(min_value=0, max_value=10**5) | _FIELD, _TIME, _TIME, _TIME, _TIME,
                        st.integers(min_value=0, max_value=12) | _FIELD,
                        st.just("") | st.builds(",{},{},{},{},{},{},{}".format, _COUNT, _TIME, _COUNT, _TIME, _TIME,
                                                _COUNT, _COUNT))


@settings(max_examples=300, deadline=None)
@given(_WATCH_LIKE | st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e, exclude_characters=";"),
                             min_size=1, max_size=200))
def test_any_shift_field_decodes_to_a_watch_that_reads_back_or_is_a_cursor_error(text):
    try:
        watch = Watch.decode(text)
    except CursorError:
        return
    again = Watch.decode(watch.encode())  # what a next cursor carries decodes, and is then stable
    assert Watch.decode(again.encode()) == again


def test_a_page_with_no_walk_and_no_reread_window_to_count_in_takes_no_rows_boundary():
    asked = []

    def boundary(at):  # Jira's is a time zone lookup per row
        asked.append(at)
        return at

    assert Watch().counted(PAGE, boundary) == Watch() and asked == []
    # a walk counts its rows, each by its boundary
    walking = Watch(walk=T, walk_to=T)
    assert walking.counted(PAGE, boundary).walk_rows == 10 and len(asked) == 10
