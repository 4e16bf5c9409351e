"""Shift rows every provider runs on pages that hold an offset: GitLab without keyset pages,
GitHub `page=` links, Jira page tokens that hold an offset (Atlassian documents them as
opaque). A provider binds them with `from tests.connectors.shifts import *` and a `world`
fixture whose simulator pages that way and that can `add_issue_at(moment)`.

Between two page requests an edit moves an issue already read out of a tie run (the rest
shift back: one is skipped) and an issue that appears with an earlier stamp shifts the rest
forward (the last item read comes back). Runs are 250 issues on one update time, read 100
a page, as a bulk change leaves them.
"""

from __future__ import annotations

from datetime import timedelta

from nexus_pipelines.local.worlds.scans import PAGE, RUN, SPACING_S, fetch, tie_run_then_tail  # noqa: F401 - bound rows use them
from tests.connectors.conformance.suite import scan


def refs_of(issues) -> set[str]:
    return {i.external_ref for i in issues}


def test_an_edit_inside_a_tie_run_while_it_is_walked_loses_no_issue(world):
    run, tail = tie_run_then_tail(world)
    adapter = world.adapter()
    first = fetch(adapter, None)
    world.update_issue(run[10], title="edited while the run was walked")  # already read: the rest shift back
    rest, tokens = scan(world, adapter, page_size=PAGE, cursor=first.next_cursor)
    world.advance(120)
    again, tokens = scan(world, adapter, page_size=PAGE, cursor=tokens[-1])
    assert refs_of([*first.issues, *rest, *again]) == set(run + tail)
    world.advance(120)
    third, _ = scan(world, adapter, page_size=PAGE, cursor=tokens[-1])
    assert not refs_of(third) & (set(run) - {run[10]})  # an unchanged run is read once more, not on every scan


def test_an_issue_that_appears_behind_the_scans_position_is_read_in_the_same_scan(world):
    run, tail = tie_run_then_tail(world)
    adapter = world.adapter()
    before_run = world.state.clock.now() - timedelta(hours=1)
    first = fetch(adapter, None)
    late = world.add_issue_at(before_run, title="stamped before the run, listed only now")  # the rest shift on
    rest, _ = scan(world, adapter, page_size=PAGE, cursor=first.next_cursor)
    assert refs_of([*first.issues, *rest]) == set(run + tail + [late])

