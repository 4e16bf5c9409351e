"""A poll run reads a scan's next page while the commit of the page before is in flight, holds it
for that revision's next claim (after other revisions' turns too), and never uses a page read
ahead of a commit that failed."""

from contextlib import contextmanager

from nexus_pipelines.connectors.core import tick
from nexus_pipelines.connectors.core.compose import CachedComposer
from nexus_pipelines.connectors.core.registry import ComposeContext
from nexus_pipelines.connectors.core.tick import poll
from nexus_pipelines.connectors.gitlab.adapter import LIMIT_STATUSES
from nexus_pipelines.connectors.provider_gate import GatePolicy, ProviderGates
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.local.simulators.http import Fault
from nexus_pipelines.local.worlds.plant import executor
from tests.connectors.support import due_gitlab_poll


class _Flights:
    """A poll's connection and its adapters, logging in order each fetch (with its revision and
    cursor) and each page commit's flight, once its COMMIT is sent and once it is answered."""

    def __init__(self, conn) -> None:
        self._conn, self.log, self.fetches = conn, [], []
        self.before_fetch = self.after_fetch = lambda: None

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
        result = self._adapter.fetch_page(request, attempt)
        self._flights.after_fetch()
        return result

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


def _gate_key(registration) -> str:
    provider = registration.provider
    return GatePolicy.for_origin(provider.base_url, f"token {provider.token}", LIMIT_STATUSES).key


def _once(action):
    done = []

    def run() -> None:
        if not done:
            done.append(action())
    return run


def _walk_held_after_the_first_page(pool, key: str, between_pages) -> tuple:
    """A walk of three pages where `between_pages` runs once the first page is fetched, before its commit."""
    plant, registration = due_gitlab_poll(pool, key, issues=10)
    plant.world.clear_requests()
    with pool.connection() as conn:
        flights = _Flights(conn)
        flights.after_fetch = _once(lambda: between_pages(plant, registration))
        report = poll(flights, REGISTRY, flights.composer(plant.composer), owner="poller", executor=executor(),
                      registration_ids=[registration.registration_id])
    return report, plant.world.requests(), flights


def test_a_hold_written_between_two_pages_stops_the_read_ahead_request_and_its_tick_reports_the_wait(pool):
    def hold(plant, registration) -> None:
        ProviderGates(pool).hold(_gate_key(registration), 120, "HTTP 429 Retry-After 120 s")

    report, requests, flights = _walk_held_after_the_first_page(pool, "read-ahead-held", hold)
    # the first page commits; the second, read ahead while that commit was in flight, is never sent
    assert [t.outcome for t in report.ticks] == ["page", "failure"] and report.stopped == "idle"
    assert len(requests) == 1 and len(flights.fetches) == 2
    held = report.ticks[1]
    assert held.failure.startswith("throttled") and "nothing was sent" in held.failure
    assert 115 <= held.retry_in_s <= 121


def test_a_retry_of_a_read_ahead_request_asks_the_gate_again(pool):
    def limited(plant, registration) -> None:  # the next list request is refused for as long as core waits in request
        plant.world.state.faults.push("list_issues", Fault(status=429, headers={"Retry-After": "2"}))

    report, requests, _ = _walk_held_after_the_first_page(pool, "read-ahead-retry", limited)
    # the read-ahead's first attempt met the limit; its retries found the gate holding it and sent nothing
    assert len(requests) == 2 and report.ticks[1].attempts > 1
    assert [t.outcome for t in report.ticks] == ["page", "failure"] and "nothing was sent" in report.ticks[1].failure


class _CountedPool:
    """The provider gates' pool, counting the connections the gates take from it."""

    def __init__(self, pool) -> None:
        self._pool, self.connections = pool, 0

    def connection(self, *args, **kwargs):
        self.connections += 1
        return self._pool.connection(*args, **kwargs)


def test_a_request_read_ahead_is_admitted_by_its_page_commits_reading_of_the_gates_not_a_round_trip_of_its_own(
        pool):
    plant, registration = due_gitlab_poll(pool, "read-ahead-gate-reading", issues=10)
    gates = _CountedPool(pool)
    composer = CachedComposer(REGISTRY, ComposeContext(transport=plant.world.transport, gates=ProviderGates(gates)),
                              environ=plant.world.environ)
    with pool.connection() as conn:
        report = poll(conn, REGISTRY, composer, owner="poller", executor=executor(),
                      registration_ids=[registration.registration_id])
    assert [t.outcome for t in report.ticks] == ["page"] * 3 and report.totals["admitted"] == 10
    assert gates.connections == 1  # the first page's own: pages 2 and 3 were read ahead
