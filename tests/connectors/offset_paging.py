"""Cursor rows for a provider that answers the issue listing with offset (page-number) pages.

A provider binds them like the shared suite: `from tests.connectors.offset_paging import *`
in its own module and a `world` fixture returning a world whose simulator pages by number
(GitHub `issue_paging="page"`, GitLab `keyset_for_issues=False`) and that can also
`delete_issue(ref)`. On offset pages an update or a deletion between two requests shifts
later items back one position; following the page links would skip one issue older than
the high-water mark, and the next scan would start after it. The adapter must re-anchor
instead: a fresh first page from the last item's time whenever the page spans more than
its boundary window, and follow the page link only inside a tie run of at least a page,
which the next scan reads once more, and again while its walked windows come back with
fewer rows (a deletion there shifts silently; the edit rows are in
`tests/connectors/shifts.py`).

Issues here are a minute apart (a millisecond apart the next scan's one-second overlap
would re-read a skipped issue and hide the skip).
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

from nexus_pipelines.connectors.core.values import FetchIssuePage
from tests.connectors.conformance.suite import executor, scan
# the shared suite's cursor rows, on offset pages too
from tests.connectors.conformance.suite import test_an_issue_updated_mid_scan_is_not_missed  # noqa: F401
from tests.connectors.conformance.suite import test_ties_across_page_boundaries_are_all_delivered_once  # noqa: F401

SPACING_S = 60


def spaced(world, count: int, *, title: str = "Issue") -> list[str]:
    refs = []
    for n in range(count):
        refs += world.add_issues(1, title=f"{title} {n}")
        world.advance(SPACING_S)
    return refs


def first_page(world, adapter, page_size: int = 10):
    page, _ = executor().fetch(adapter, FetchIssuePage(cursor=None, page_size=page_size))
    return page


def first_page_then_next_request(world, offsets: list[timedelta], page_size: int = 10):
    """Issues updated at `offsets` after an hour ago, a first page of `page_size`, and the one
    listing request the next invocation sends: (that hour-ago start, the page, the request)."""
    start = world.state.clock.now() - timedelta(hours=1)
    for n, offset in enumerate(offsets):
        world.add_issue_at(start + offset, title=f"Issue {n}")
    adapter = world.adapter()
    first = first_page(world, adapter, page_size)
    world.clear_requests()
    executor().fetch(adapter, FetchIssuePage(cursor=first.next_cursor, page_size=page_size))
    (request,) = [r for r, (operation, _) in zip(world.transport.requests, world.requests()) if operation == "list"]
    return start, first, request


def versions(issues) -> set[tuple[str, str, object]]:
    return {(i.external_ref, i.title, i.external_updated_at) for i in issues}


def refs_and_titles(issues) -> set[tuple[str, str]]:
    return {(i.external_ref, i.title) for i in issues}


def list_queries(world) -> list[dict[str, str]]:
    """The query of every listing request the world's transport received, in order."""
    return [{k: v[-1] for k, v in parse_qs(urlsplit(str(request.url)).query, keep_blank_values=True).items()}
            for request, (operation, _) in zip(world.transport.requests, world.requests()) if operation == "list"]


def assert_unchanged_rescan_adds_nothing(world, adapter, cursor, delivered) -> None:
    world.advance(120)
    again, _ = scan(world, adapter, page_size=10, cursor=cursor)
    assert versions(again) <= versions(delivered)  # overlap only: nothing new, nothing lost


def test_every_issue_is_delivered_on_offset_pages_and_no_page_number_is_built(world):
    refs = spaced(world, 35)
    adapter = world.adapter()
    world.clear_requests()
    issues, tokens = scan(world, adapter, page_size=10)
    assert {i.external_ref for i in issues} == set(refs)
    assert all(int(q.get("page", "1")) == 1 for q in list_queries(world))  # a chain of first pages
    assert not any(re.search(r"[?&]page=", token) for token in tokens[1:])  # no page number is ever the cursor
    assert_unchanged_rescan_adds_nothing(world, adapter, tokens[-1], issues)


def test_an_issue_updated_mid_scan_on_offset_pages_skips_nothing(world):
    adapter = world.adapter()
    refs = spaced(world, 30)
    first = first_page(world, adapter)
    world.update_issue(refs[2], title="moved to the end by an update")  # already read: the rest shift back
    rest, tokens = scan(world, adapter, page_size=10, cursor=first.next_cursor)
    delivered = list(first.issues) + rest
    assert {i.external_ref for i in delivered} == set(refs)  # in this very scan, not the next
    assert (refs[2], "moved to the end by an update") in refs_and_titles(delivered)
    assert_unchanged_rescan_adds_nothing(world, adapter, tokens[-1], delivered)


def test_an_issue_updated_ahead_of_the_scan_is_delivered_in_its_new_version(world):
    adapter = world.adapter()
    refs = spaced(world, 30)
    first = first_page(world, adapter)
    world.update_issue(refs[20], title="changed before it was read")
    rest, _ = scan(world, adapter, page_size=10, cursor=first.next_cursor)
    delivered = list(first.issues) + rest
    assert {i.external_ref for i in delivered} == set(refs)
    assert (refs[20], "changed before it was read") in refs_and_titles(delivered)


def test_an_issue_deleted_mid_scan_on_offset_pages_skips_nothing(world):
    adapter = world.adapter()
    refs = spaced(world, 30)
    first = first_page(world, adapter)
    world.delete_issue(refs[3])  # already read: the rest shift back
    rest, tokens = scan(world, adapter, page_size=10, cursor=first.next_cursor)
    delivered = list(first.issues) + rest
    assert {i.external_ref for i in delivered} == set(refs)
    assert_unchanged_rescan_adds_nothing(world, adapter, tokens[-1], delivered)


def test_ties_across_offset_page_boundaries_are_all_delivered(world):
    adapter = world.adapter()
    refs = []
    for size in (25, 3, 10, 1, 14):  # tie runs longer than, shorter than and exactly a page
        refs += world.add_issues(size, same_updated_at=True)
        world.advance(SPACING_S)
    refs += spaced(world, 12)
    issues, tokens = scan(world, adapter, page_size=10)
    assert {i.external_ref for i in issues} == set(refs)
    assert_unchanged_rescan_adds_nothing(world, adapter, tokens[-1], issues)


def test_offset_pages_cost_about_one_reread_boundary_item_per_page(world):
    adapter = world.adapter()
    count, page_size = 500, 100
    refs = spaced(world, count)
    world.clear_requests()
    issues, _ = scan(world, adapter, page_size=page_size)
    calls = len(list_queries(world))
    assert {i.external_ref for i in issues} == set(refs)
    rereads = len(issues) - count
    # each re-anchored page starts again at its predecessor's last item (GitHub: its whole second)
    assert rereads <= calls - 1 and calls <= math.ceil(count / (page_size - 1)) + 1, (calls, rereads)
    print(f"offset paging: {count} issues, {calls} list calls (keyset: {math.ceil(count / page_size)}), "
          f"{rereads} boundary items re-read")


def test_a_deletion_inside_a_tie_run_while_it_is_walked_loses_no_issue(world):
    adapter = world.adapter()
    run = world.add_issues(250, same_updated_at=True)  # a bulk change: one update time, several pages
    world.advance(SPACING_S)
    tail = spaced(world, 5)
    first = first_page(world, adapter, page_size=100)
    world.delete_issue(run[10])  # already read: the rest shift back, and nothing says so
    rest, tokens = scan(world, adapter, page_size=100, cursor=first.next_cursor)
    world.advance(120)
    again, tokens = scan(world, adapter, page_size=100, cursor=tokens[-1])  # reads the walked run once more
    assert {i.external_ref for i in [*first.issues, *rest, *again]} == set(run + tail)
    world.advance(120)
    third, _ = scan(world, adapter, page_size=100, cursor=tokens[-1])
    assert not {i.external_ref for i in third} & set(run)  # once, not on every scan


def scan_deleting(world, adapter, *, cursor: str | None, page_size: int, after_pages: int, ref: str):
    """One scan that deletes `ref` once `after_pages` of its pages were read; (issues, tokens)."""
    issues, tokens = [], [cursor]
    while True:
        page, _ = executor().fetch(adapter, FetchIssuePage(cursor=tokens[-1], page_size=page_size))
        issues += page.issues
        tokens.append(page.next_cursor)
        if len(tokens) - 1 == after_pages:
            world.delete_issue(ref)
        if page.exhausted:
            return issues, tokens


def test_a_deletion_while_the_owed_reread_walks_a_tie_run_loses_no_issue(world):
    adapter = world.adapter()
    run = world.add_issues(25, same_updated_at=True)
    world.advance(SPACING_S)
    tail = spaced(world, 3)
    # the first walk skips run[20]: a deletion after its second page shifts it onto that page
    first, tokens = scan_deleting(world, adapter, cursor=None, page_size=10, after_pages=2, ref=run[3])
    assert run[20] not in {i.external_ref for i in first}
    for ref in run[4:13]:  # gone before the re-read: run[20] is now the first of the re-read's second page
        world.delete_issue(ref)
    world.advance(120)
    # the owed re-read skips it too (a deletion after its first page), and no update says so
    second, tokens = scan_deleting(world, adapter, cursor=tokens[-1], page_size=10, after_pages=1, ref=run[0])
    world.advance(120)
    third, tokens = scan(world, adapter, page_size=10, cursor=tokens[-1])  # the run came back shorter: once more
    listed = {i.external_ref for i in [*first, *second, *third]}
    assert set(run[1:3] + run[13:] + tail) <= listed
    world.advance(120)
    fourth, _ = scan(world, adapter, page_size=10, cursor=tokens[-1])
    assert not {i.external_ref for i in fourth} & set(run)  # an unchanged run is not read again


def test_a_deletion_while_the_owed_reread_walks_a_chain_of_tie_runs_loses_no_issue(world):
    adapter = world.adapter()
    first_run = world.add_issues(20, same_updated_at=True)  # two pages of one run, then one of the next:
    world.advance(SPACING_S)                                # one walk across both runs' windows
    second_run = world.add_issues(15, same_updated_at=True)
    world.advance(SPACING_S)
    tail = spaced(world, 3)
    lost = second_run[10]
    # the first walk skips it: a deletion after its third page shifts it onto that page
    first, tokens = scan_deleting(world, adapter, cursor=None, page_size=10, after_pages=3, ref=second_run[0])
    assert lost not in {i.external_ref for i in first}
    for ref in second_run[1:10]:  # gone before the re-read: it is now the first of the re-read's third page
        world.delete_issue(ref)
    world.advance(120)
    # the owed re-read skips it too (a deletion after its second page), and no update says so
    second, tokens = scan_deleting(world, adapter, cursor=tokens[-1], page_size=10, after_pages=2, ref=first_run[0])
    world.advance(120)
    third, tokens = scan(world, adapter, page_size=10, cursor=tokens[-1])  # the walk came back otherwise: once more
    missing = set(first_run[1:] + second_run[10:] + tail) - {i.external_ref for i in [*first, *second, *third]}
    assert not missing
    rereads = []
    for _ in range(3):
        world.advance(120)
        again, tokens = scan(world, adapter, page_size=10, cursor=tokens[-1])
        rereads.append(bool({i.external_ref for i in again} & set(first_run + second_run)))
    # once more (the third scan listed one row fewer than the second, which listed one deleted while it ran), then not
    assert rereads == [True, False, False]


def test_a_deletion_while_the_owed_reread_walks_a_later_tie_run_of_the_scan_loses_no_issue(world):
    adapter = world.adapter()
    first_run = world.add_issues(20, same_updated_at=True)
    world.advance(SPACING_S)
    between = spaced(world, 5)  # the pages re-anchor between the two walks
    second_run = world.add_issues(25, same_updated_at=True)
    world.advance(SPACING_S)
    tail = spaced(world, 3)
    lost = second_run[20]
    # the second walk skips it: a deletion after that walk's second page (the scan's fifth)
    first, tokens = scan_deleting(world, adapter, cursor=None, page_size=10, after_pages=5, ref=second_run[0])
    assert lost not in {i.external_ref for i in first}
    for ref in second_run[1:10]:  # gone before the re-read: it is now the first of that walk's second page
        world.delete_issue(ref)
    world.advance(120)
    # the owed re-read (from the first walk) skips it too in the second walk, and no update says so
    second, tokens = scan_deleting(world, adapter, cursor=tokens[-1], page_size=10, after_pages=4,
                                   ref=second_run[10])
    world.advance(120)
    third, tokens = scan(world, adapter, page_size=10, cursor=tokens[-1])
    missing = set(first_run + between + second_run[11:] + tail) - {i.external_ref for i in [*first, *second, *third]}
    assert not missing
