"""A poll page commits its receipts and its cursor in a fixed number of statements, whatever
the page size: no round trip per issue; and a walk of many pages commits once per page."""

import time
from datetime import UTC, datetime, timedelta

import pytest

from nexus_pipelines.connectors.core import store
from nexus_pipelines.connectors.core.tick import IssueVersions, poll
from nexus_pipelines.connectors.core.values import ExternalIssue, FetchIssuePage
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.local.worlds.gitlab import GitLabWorld
from nexus_pipelines.local.worlds.plant import Plant, executor
from tests.connectors.support import due_gitlab_poll, expired_claim
from tests.workqueue.support import CountingConnection


def _statements_for_one_page(pool, key: str, issues: int) -> tuple[int, int]:
    plant, registration = due_gitlab_poll(pool, key, issues, page_size=100)
    with pool.connection() as conn:
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
    assert one <= 5, one  # the claim; BEGIN, the fenced cursor update, the page's receipts, COMMIT


def test_a_walk_of_many_pages_commits_once_per_page_with_the_next_claim_in_the_page_commit(pool):
    plant, registration = due_gitlab_poll(pool, "walk", issues=10)
    with pool.connection() as conn:
        counting = CountingConnection(conn)
        report = poll(counting, REGISTRY, plant.composer, owner="poller", executor=executor(),
                      registration_ids=[registration.registration_id])
    assert [t.outcome for t in report.ticks] == ["page"] * 3 and report.stopped == "idle"
    assert report.totals["admitted"] == 10
    assert counting.commits == 1 + 3, counting.commits  # the first claim, then one commit per page


def test_a_walk_updates_the_progress_row_once_a_page_when_the_revision_is_its_own_next_claim(pool):
    plant, registration = due_gitlab_poll(pool, "once-a-page", issues=10)
    with pool.connection() as conn:
        conn.execute("CREATE TABLE progress_row_updates (registration_key text)")
        conn.execute("""CREATE FUNCTION count_progress_update() RETURNS trigger LANGUAGE plpgsql AS
                        $$ BEGIN INSERT INTO progress_row_updates VALUES (NEW.registration_key); RETURN NEW; END $$""")
        conn.execute("CREATE TRIGGER count_progress_update AFTER UPDATE ON connector_progress "
                     "FOR EACH ROW EXECUTE FUNCTION count_progress_update()")
        try:
            report = poll(conn, REGISTRY, plant.composer, owner="poller", executor=executor(),
                          registration_ids=[registration.registration_id])
            (updates,) = conn.execute("SELECT count(*) FROM progress_row_updates WHERE registration_key = %s",
                                      (registration.key,)).fetchone()
            progress = conn.execute("SELECT cursor_token, pages, lease_until FROM connector_progress "
                                    "WHERE registration_key = %s", (registration.key,)).fetchone()
        finally:
            conn.execute("DROP TRIGGER count_progress_update ON connector_progress")
    assert [t.outcome for t in report.ticks] == ["page"] * 3 and report.stopped == "idle"
    assert updates == 1 + 3  # the first claim, then each page's cursor update, which also kept the lease
    assert progress == (report.ticks[-1].cursor, 3, None)
    assert report.totals["admitted"] == 10


def test_a_run_stopped_by_its_budget_gives_back_the_claim_its_last_page_took(pool):
    plant, registration = due_gitlab_poll(pool, "budget", issues=10)
    with pool.connection() as conn:
        report = poll(conn, REGISTRY, plant.composer, owner="poller", executor=executor(),
                      registration_ids=[registration.registration_id], time_budget_s=0.5,
                      on_tick=lambda _: time.sleep(0.6))  # the budget ends after the first page
        (due,) = conn.execute("SELECT next_poll_at <= now() FROM connector_progress WHERE registration_key = %s",
                              (registration.key,)).fetchone()
        held = store.poll_lease_held(conn, registration)
    assert [t.outcome for t in report.ticks] == ["page"] and report.stopped == "time_budget"
    assert not held and due  # the next poll can take it at once, not after the lease runs out


def test_an_empty_page_advances_the_cursor_under_its_fence(pool):
    plant, registration = due_gitlab_poll(pool, "empty", issues=0)
    with pool.connection() as conn:
        report = poll(conn, REGISTRY, plant.composer, owner="poller", executor=executor(),
                      registration_ids=[registration.registration_id])
        (cursor, pages) = conn.execute("SELECT cursor_token, pages FROM connector_progress WHERE registration_key = %s",
                                       (registration.key,)).fetchone()
    (tick,) = report.ticks
    assert tick.outcome == "page" and tick.issues == 0 and tick.exhausted
    assert cursor == tick.cursor and pages == 1


def test_a_stale_page_commit_writes_no_receipt_and_takes_no_next_claim(pool):
    plant = Plant(GitLabWorld(), pool)
    registration = plant.world.registration(key="stale")
    plant.activate(registration)
    issue = ExternalIssue(connector_kind="gitlab", external_ref="gitlab:1:999", title="t", description="",
                          source_labels=(), reporter_ref="gitlab-user:1", reporter_display_name="r",
                          external_state="open", external_updated_at=datetime.now(UTC), display_url="https://x.test/1")
    with pool.connection() as conn:
        store.request_poll(conn, [registration.registration_id])
        stale = expired_claim(conn, registration)
        with pytest.raises(store.PollLeaseLost):
            store.commit_page(conn, stale, [IssueVersions(registration)(issue)], next_cursor="stale", exhausted=False,
                              then_claim=store.ClaimRequest(REGISTRY, "slow", timedelta(seconds=60)))
        (receipts,) = conn.execute("SELECT count(*) FROM ingress_receipts WHERE registration_id = %s",
                                   (registration.registration_id,)).fetchone()
        progress = conn.execute("SELECT lease_token, cursor_token FROM connector_progress WHERE registration_key = %s",
                                (registration.key,)).fetchone()
    assert receipts == 0 and progress == (stale.token, None)


@pytest.mark.parametrize("title", ["plain ascii", "Ünïcode ✓ 問題"])
def test_a_page_receipt_stores_the_issue_version_body_its_hash_and_its_unchanged_digest(pool, title):
    from nexus_pipelines.connectors.core.values import source_version_digest
    from nexus_pipelines.workqueue.receipts import canonical_json, payload_hash

    plant = Plant(GitLabWorld(), pool)
    registration = plant.world.registration(key=f"body-{len(title)}")
    plant.activate(registration)
    issue = ExternalIssue(connector_kind="gitlab", external_ref="gitlab:1:7", title=title, description="é\n",
                          source_labels=("bug",), reporter_ref="gitlab-user:1", reporter_display_name="r",
                          external_state="open", external_updated_at=datetime.now(UTC), display_url="https://x.test/7")
    version = IssueVersions(registration)(issue)
    assert version.canonical_body == canonical_json(version.body)  # the spliced form is the canonical one
    assert version.digest == source_version_digest(issue) == version.body["digest"]
    with pool.connection() as conn:
        store.request_poll(conn, [registration.registration_id])
        claim = store.claim_due(conn, REGISTRY, owner="poller", ttl=timedelta(seconds=60),
                                registration_ids=[registration.registration_id])
        commit = store.commit_page(conn, claim, [version], next_cursor="next", exhausted=True)
        (body, stored_hash) = conn.execute("SELECT body, payload_hash FROM ingress_receipts WHERE registration_id = %s",
                                           (registration.registration_id,)).fetchone()
    assert commit.admitted_refs == ["gitlab:1:7"]
    assert body == version.body and stored_hash == payload_hash(version.body)


def _syncs_of_one_page_commit(pool, tmp_path, key: str) -> int:
    """The Sync messages (each one a round trip: the server answers a flight at its Sync) that
    one page commit, with the next tick's claim, sends, read from libpq's protocol trace."""
    from psycopg import pq

    plant, registration = due_gitlab_poll(pool, key, issues=3)
    adapter = plant.composer(registration)
    trace = tmp_path / f"{key}.trace"
    with pool.connection() as conn:
        claim = store.claim_due(conn, REGISTRY, owner="poller", ttl=timedelta(seconds=60),
                                registration_ids=[registration.registration_id])
        page, _ = executor().fetch(adapter, FetchIssuePage(cursor=None, page_size=4))
        versions = [IssueVersions(registration)(i) for i in page.issues]
        with trace.open("w") as out:
            conn.pgconn.trace(out.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
            try:
                commit = store.commit_page(conn, claim, versions, next_cursor=page.next_cursor, exhausted=False,
                                           then_claim=store.ClaimRequest(REGISTRY, "poller", timedelta(seconds=60)))
            finally:
                conn.pgconn.untrace()
        conn.execute("SELECT 1")  # the connection is usable after the commit
    assert len(commit.admitted_refs) == 3 and commit.next_claim is not None
    return sum(1 for line in trace.read_text().splitlines() if line.split()[:1] == ["F"] and "Sync" in line)


def test_a_page_commit_with_the_next_claim_is_one_round_trip(pool, tmp_path):
    assert _syncs_of_one_page_commit(pool, tmp_path, "one-flight") == 1


def test_a_page_commit_that_fails_before_its_commit_is_sent_writes_nothing_and_leaves_the_connection_idle(pool):
    from psycopg.pq import TransactionStatus

    from nexus_pipelines.workqueue.receipts import BODY_SNAPSHOT_LIMIT

    plant, registration = due_gitlab_poll(pool, "too-big", issues=2)
    adapter = plant.composer(registration)
    with pool.connection() as conn:
        claim = store.claim_due(conn, REGISTRY, owner="poller", ttl=timedelta(seconds=60),
                                registration_ids=[registration.registration_id])
        page, _ = executor().fetch(adapter, FetchIssuePage(cursor=None, page_size=4))
        fine, big = map(IssueVersions(registration), page.issues)
        too_big = store.IssueVersion(big.external_ref, big.updated_at, big.digest,
                                     '{"t":"' + "x" * BODY_SNAPSHOT_LIMIT + '"}')
        with pytest.raises(ValueError, match="exceeds"):
            store.commit_page(conn, claim, [fine, too_big], next_cursor=page.next_cursor, exhausted=False)
        assert conn.info.transaction_status == TransactionStatus.IDLE
        (receipts,) = conn.execute("SELECT count(*) FROM ingress_receipts WHERE registration_id = %s",
                                   (registration.registration_id,)).fetchone()
        progress = conn.execute("SELECT lease_token, cursor_token, pages FROM connector_progress "
                                "WHERE registration_key = %s", (registration.key,)).fetchone()
    assert receipts == 0 and progress == (claim.token, None, 0)


def test_a_page_commit_refuses_to_run_inside_a_callers_transaction(pool):
    plant, registration = due_gitlab_poll(pool, "nested", issues=0)
    with pool.connection() as conn:
        claim = store.claim_due(conn, REGISTRY, owner="poller", ttl=timedelta(seconds=60),
                                registration_ids=[registration.registration_id])
        with pytest.raises(RuntimeError, match="outside"), conn.transaction():
            store.commit_page(conn, claim, [], next_cursor="next", exhausted=True)
        (cursor,) = conn.execute("SELECT cursor_token FROM connector_progress WHERE registration_key = %s",
                                 (registration.key,)).fetchone()
    assert cursor is None


def test_a_page_maps_each_label_set_once_and_serializes_the_facts_its_receipts_share_once(pool, monkeypatch):
    from nexus_pipelines.connectors.core import tick
    from nexus_pipelines.connectors.core.registration import Registration
    from nexus_pipelines.workqueue.receipts import payload_hash

    calls = {"map_labels": 0, "canonical_json_with": 0}

    def counted(name, function):
        def call(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return call

    monkeypatch.setattr(Registration, "map_labels", counted("map_labels", Registration.map_labels))
    monkeypatch.setattr(tick, "canonical_json_with", counted("canonical_json_with", tick.canonical_json_with))
    plant = Plant(GitLabWorld(), pool)
    registration = plant.world.registration(key="shared-facts", page_size=100)
    plant.activate(registration)
    plant.world.add_issues(20)  # every other issue labelled "bug": two label sets
    with pool.connection() as conn:
        store.request_poll(conn, [registration.registration_id])
        report = poll(conn, REGISTRY, plant.composer, owner="poller", executor=executor(),
                      registration_ids=[registration.registration_id], max_ticks=1)
        rows = conn.execute("SELECT body, payload_hash FROM ingress_receipts WHERE registration_id = %s",
                            (registration.registration_id,)).fetchall()
    assert report.ticks[0].admitted == len(rows) == 20
    assert calls == {"map_labels": 2, "canonical_json_with": 1}
    assert sorted(body["labels"] for body, _ in rows) == [[]] * 10 + [["bug"]] * 10
    assert all(body["revision_id"] == registration.revision_id and body["project"] == registration.project
               for body, _ in rows)
    # the body text the page built is the canonical form of what was stored
    assert all(stored_hash == payload_hash(body) for body, stored_hash in rows)


def test_a_page_serializes_each_all_ascii_issue_once_for_its_digest_and_its_receipt_body(pool, monkeypatch):
    calls = {"model_dump": 0, "model_dump_json": 0}

    def counted(name):
        function = getattr(ExternalIssue, name)

        def call(self, *args, **kwargs):
            calls[name] += 1
            return function(self, *args, **kwargs)
        return call

    for name in calls:
        monkeypatch.setattr(ExternalIssue, name, counted(name))
    plant, registration = due_gitlab_poll(pool, "serialized-once", issues=4)
    with pool.connection() as conn:
        report = poll(conn, REGISTRY, plant.composer, owner="poller", executor=executor(),
                      registration_ids=[registration.registration_id], max_ticks=1)
    assert report.ticks[0].admitted == 4
    assert calls == {"model_dump": 0, "model_dump_json": 4}
