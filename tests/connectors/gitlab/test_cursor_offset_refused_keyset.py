"""GitLab bound to the offset-paging cursor rows once more, for a GitLab that refuses
`pagination=keyset` on the issues listing with its 405 ("Keyset pagination is not yet
available for this type of request") instead of ignoring it: the adapter asks again for
offset pages, which the cursor re-anchors."""

import pytest

from nexus_pipelines.local.worlds.gitlab import GitLabWorld
from tests.connectors.gitlab.test_adapter import fetch, query_of
from tests.connectors.offset_paging import *  # noqa: F403 - the offset-paging rows run here for this GitLab


@pytest.fixture
def world():
    world = GitLabWorld(keyset_for_issues=False)
    world.state.keyset_refused_with_405 = True
    return world


def test_a_refused_keyset_request_is_asked_again_for_offset_pages_in_the_same_invocation(world):
    world.add_issues(3)
    page = fetch(world)
    first, again = world.transport.requests
    assert query_of(first)["pagination"] == "keyset" and "pagination" not in query_of(again)
    assert len(page.issues) == 3 and page.exhausted
