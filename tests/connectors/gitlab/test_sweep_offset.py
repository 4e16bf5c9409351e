"""The GitLab sweep on offset pages (a GitLab that ignores keyset for issues): a deletion
between two listing requests shifts every later issue back one position, so following the
page link would skip the first issue of the next page; the walk re-anchors at the page's
last `created_at` instead, and the sweep still finds a gap there."""

import httpx

from nexus_pipelines.local.worlds.gitlab import GitLabWorld
from nexus_pipelines.local.worlds.plant import Plant
from tests.connectors.support import tickets_by_ref
from tests.connectors.sweep_suite import JUDGE_ALL


class _DeleteAfterFirstListing(httpx.BaseTransport):
    """Deletes one issue from the simulator right after the first listing answer."""

    def __init__(self, inner: httpx.BaseTransport, delete) -> None:
        self.inner, self.delete, self.armed = inner, delete, False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if self.armed and request.url.path.endswith("/issues"):
            self.armed = False
            self.delete()
        return response


def test_a_deletion_between_offset_pages_does_not_hide_the_next_pages_first_issue(pool):
    world = GitLabWorld(project_id=919191, keyset_for_issues=False)
    refs = world.add_issues(150)
    hook = _DeleteAfterFirstListing(world.transport, lambda: world.delete_issue(refs[5]))
    world.transport = hook
    plant = Plant(world, pool)
    registration = world.registration(key="sweep-offset-shift")
    plant.activate(registration)
    plant.sync([registration])
    lost = refs[100]  # the first issue of the second page, by creation
    with pool.connection() as conn, conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")  # a lost custody row
        conn.execute("DELETE FROM ticket_custody_links WHERE external_ref = %s", (lost,))
        assert lost not in tickets_by_ref(conn, registration)

    hook.armed = True
    report = plant.sweep(registration, bounds=JUDGE_ALL)
    assert [(g.external_ref, g.reason) for g in report.gaps] == [(lost, "missing")]
    assert report.listed == 150  # the deleted issue was listed before it was deleted
