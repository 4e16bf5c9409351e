"""Whole scans over a world's adapter and the tie-run shape the shift rows and the polling
bench share: 250 issues on one update time, read 100 a page, as a bulk change leaves them."""

from __future__ import annotations

from nexus_pipelines.connectors.core.values import ExternalIssuePage, FetchIssuePage
from nexus_pipelines.local.worlds.plant import executor

PAGE, RUN, SPACING_S = 100, 250, 60


def scan(adapter, *, page_size: int = 100, cursor: str | None = None, max_pages: int = 500):
    """Fetch until the scan is exhausted; returns (issues in order, tokens)."""
    issues, tokens = [], [cursor]
    for _ in range(max_pages):
        result, _ = executor().fetch(adapter, FetchIssuePage(cursor=tokens[-1], page_size=page_size))
        if not isinstance(result, ExternalIssuePage):
            raise AssertionError(f"a page failed: {result}")
        issues.extend(result.issues)
        tokens.append(result.next_cursor)
        if result.exhausted:
            return issues, tokens
    raise AssertionError("the scan never ended")


def tie_run_then_tail(world, tail: int = 5) -> tuple[list[str], list[str]]:
    """A run of `RUN` issues on one update time, then `tail` issues a minute apart."""
    run = world.add_issues(RUN, same_updated_at=True)
    refs = []
    for n in range(tail):
        world.advance(SPACING_S)
        refs += world.add_issues(1, title=f"Later {n}")
    world.advance(SPACING_S)
    return run, refs


def fetch(adapter, cursor):
    page, _ = executor().fetch(adapter, FetchIssuePage(cursor=cursor, page_size=PAGE))
    return page
