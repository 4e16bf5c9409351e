"""A poll run reads a scan's next page while the commit of the page before is in flight, holds it
for that revision's next claim (after other revisions' turns too), and never uses a page read
ahead of a commit that failed."""

from contextlib import contextmanager

from nexus_pipelines.connectors.core import tick
from nexus_pipelines.connectors.core.tick import poll
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.local.worlds.plant import executor
from tests.connectors.support import due_gitlab_poll


class _Flights:
    """A poll's connection and its adapters, logging in order each fetch (with its revision and
    cursor) and each page commit's flight, once its COMMIT is sent and once it is answered."""

    def __init__(self, conn) -> None:
        self._conn, self.log, self.fetches = conn, [], []
        self.before_fetch = lambda: None

    def execute(self, query, *args, **kwargs):
        if query == "COMMIT":
            self.log.append("sent")
        return self._conn.execute(query, *args, **kwargs)

    @contextmanager
    def pipeline(self):
        with self._conn.pipeline() as pipeline:
            yield pipeline
        self.log.append("answered")

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def composer(self, compose):
        return lambda registration: _LoggedAdapter(compose(registration), registration.key, self)


class _LoggedAdapter:
    def __init__(self, adapter, key: str, flights: _Flights) -> None:
        self._adapter, self._key, self._flights = adapter, key, flights

    def fetch_page(self, request, attempt):
        self._flights.before_fetch()
        self._flights.log.append("fetch")
        self._flights.fetches.append((self._key, request.cursor))
        return self._adapter.fetch_page(request, attempt)

    def __getattr__(self, name):
        return getattr(self._adapter, name)


def _receipts(conn, registration) -> int:
    return conn.execute("SELECT count(DISTINCT body->'issue'->>'external_ref') FROM ingress_receipts "
                        "WHERE registration_id = %s", (registration.registration_id,)).fetchone()[0]


def test_a_walk_fetches_the_next_page_while_the_commit_of_the_page_before_is_in_flight(pool):
    plant, registration = due_gitlab_poll(pool, "read-ahead", issues=10)
    with pool.connection() as conn:
        flights = _Flights(conn)
        report = poll(flights, REGISTRY, flights.composer(plant.composer), owner="poller", executor=executor(),
                      registration_ids=[registration.registration_id])
        receipts = _receipts(conn, registration)
    assert [t.outcome for t in report.ticks] == ["page"] * 3 and report.stopped == "idle"
    # pages 1 and 2 have a next page, read between their COMMIT and its answer; page 3 ends the scan
    assert flights.log == ["fetch", "sent", "fetch", "answered", "sent", "fetch", "answered", "sent", "answered"]
    assert [c for _, c in flights.fetches] == [None, report.ticks[0].cursor, report.ticks[1].cursor]  # once each
    assert report.totals["admitted"] == receipts == 10


def test_a_page_read_ahead_of_a_commit_that_lost_its_lease_is_not_used(pool):
    from psycopg.pq import TransactionStatus

    plant, registration = due_gitlab_poll(pool, "read-ahead-lost", issues=10)
    with pool.connection() as conn, pool.connection() as other:
        flights = _Flights(conn)
        first_flight = flights.pipeline

        def expire() -> None:  # the lease runs out, then the cursor update held back by the lock goes on
            if other.info.transaction_status == TransactionStatus.INTRANS:
                other.execute("UPDATE connector_progress SET lease_until = now() - interval '1 second' "
                              "WHERE registration_key = %s", (registration.key,))
                other.execute("COMMIT")

        @contextmanager
        def held_back():
            """The first page's cursor update waits for a lock until the next page is fetched (or
            the flight is about to be answered), and finds the lease expired then: the fence
            fails after the page was read ahead, whenever the server would have answered."""
            flights.pipeline = first_flight
            other.execute("BEGIN")
            other.execute("SELECT FROM connector_progress WHERE registration_key = %s FOR UPDATE", (registration.key,))
            with first_flight() as pipeline:
                yield pipeline
                expire()

        flights.pipeline, flights.before_fetch = held_back, expire
        report = poll(flights, REGISTRY, flights.composer(plant.composer), owner="poller", executor=executor(),
                      registration_ids=[registration.registration_id])
        receipts = _receipts(conn, registration)
    # the lost page wrote nothing; the run claimed again from the stored cursor (none), not the page read ahead
    assert [t.outcome for t in report.ticks] == ["lost", "page", "page", "page"]
    cursors = [c for _, c in flights.fetches]  # the second: page 2, read ahead of the lost commit
    assert len(cursors) == 5 and cursors[0] is None and cursors[2:] == [None] + [t.cursor for t in report.ticks[1:3]]
    assert report.totals["admitted"] == receipts == 10


def _two_scans_taking_turns(pool, key: str):
    """A short scan (two pages, due first) and a long one (four pages), polled in one run; its log."""
    short_plant, short = due_gitlab_poll(pool, f"{key}-short", issues=6)
    long_plant, long = due_gitlab_poll(pool, f"{key}-long", issues=14)
    composers = {short.key: short_plant.composer, long.key: long_plant.composer}
    with pool.connection() as conn:
        flights = _Flights(conn)
        report = poll(flights, REGISTRY, flights.composer(lambda r: composers[r.key](r)), owner="poller",
                      executor=executor(), registration_ids=[short.registration_id, long.registration_id])
        receipts = _receipts(conn, short) + _receipts(conn, long)
    assert [t.registration_id for t in report.ticks] == [short.registration_id, long.registration_id] * 2 + [
        long.registration_id] * 2  # the two scans take turns while both are due
    assert len(flights.fetches) == len(set(flights.fetches)) == 6  # no page read ahead and thrown away
    assert report.totals["admitted"] == receipts == 20
    return flights.log


def test_a_run_over_several_due_registrations_reads_each_scans_next_page_ahead_for_its_next_turn(pool):
    log = _two_scans_taking_turns(pool, "read-ahead-turns")
    # every page that does not end its scan reads the next one while its commit is in flight,
    # and that revision's next turn, after the other's, uses it
    assert log == ["fetch", "sent", "fetch", "answered", "fetch", "sent", "fetch", "answered",  # short 1, long 1
                   "sent", "answered", "sent", "fetch", "answered",  # short 2 (its last), long 2
                   "sent", "fetch", "answered", "sent", "answered"]  # long 3, long 4 (its last)


def test_a_run_holds_at_most_max_pages_ahead_and_reads_none_ahead_while_that_many_are_held(pool, monkeypatch):
    monkeypatch.setattr(tick, "MAX_PAGES_AHEAD", 1)
    log = _two_scans_taking_turns(pool, "read-ahead-bounded")
    # the long scan's first commit reads nothing ahead while the short scan's page is held
    assert log == ["fetch", "sent", "fetch", "answered", "fetch", "sent", "answered",  # short 1, long 1
                   "sent", "answered", "fetch", "sent", "fetch", "answered",  # short 2 (its last), long 2
                   "sent", "fetch", "answered", "sent", "answered"]  # long 3, long 4 (its last)
