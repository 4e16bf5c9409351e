"""A poll page commits its receipts and its cursor in a fixed number of statements, whatever
the page size: no round trip per issue."""

from nexus_pipelines.connectors.core import store
from nexus_pipelines.connectors.core.tick import poll
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.local.worlds.gitlab import GitLabWorld
from nexus_pipelines.local.worlds.plant import Plant, executor


class CountingConnection:
    """The connection a poll runs on, counting the statements it sends."""

    def __init__(self, conn) -> None:
        self._conn = conn
        self.statements = 0

    def execute(self, *args, **kwargs):
        self.statements += 1
        return self._conn.execute(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def _statements_for_one_page(pool, key: str, issues: int) -> tuple[int, int]:
    plant = Plant(GitLabWorld(), pool)
    registration = plant.world.registration(key=key, page_size=100)
    plant.activate(registration)
    plant.world.add_issues(issues)
    with pool.connection() as conn:
        store.request_poll(conn, [registration.registration_id])
        counting = CountingConnection(conn)
        report = poll(counting, REGISTRY, plant.composer, owner="poller", executor=executor(),
                      registration_ids=[registration.registration_id], max_ticks=1)
        (receipts,) = conn.execute("SELECT count(*) FROM ingress_receipts WHERE registration_id = %s",
                                   (registration.registration_id,)).fetchone()
    (tick,) = report.ticks
    assert tick.outcome == "page" and tick.admitted == issues == receipts
    return counting.statements, receipts


def test_a_page_of_many_issues_commits_in_as_many_statements_as_a_page_of_one(pool):
    one, _ = _statements_for_one_page(pool, "page-of-one", 1)
    many, _ = _statements_for_one_page(pool, "page-of-many", 60)
    assert many == one
    assert one <= 3, one  # the claim, the fenced cursor update, the page's receipts
