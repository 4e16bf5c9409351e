"""The shared cursor rules every provider's cursor uses (scan_cursor.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from nexus_pipelines.connectors.scan_cursor import is_keyset_link, next_scan_since, reanchor

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
