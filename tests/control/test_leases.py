from __future__ import annotations

import multiprocessing
import threading
import time
from datetime import timedelta

import pytest

from nexus_pipelines.control import leases
from nexus_pipelines.control.db import connect

TTL = timedelta(seconds=30)


def _race(dsn: str, name: str, owner: str, barrier) -> int | None:
    with connect(dsn) as conn:
        barrier.wait()
        lease = leases.acquire(conn, name, owner, TTL)
        return lease.token if lease else None


def test_threads_racing_for_one_lease_get_exactly_one_winner(control_dsn):
    barrier = threading.Barrier(16)
    results: list[int | None] = []
    lock = threading.Lock()

    def worker(index: int) -> None:
        token = _race(control_dsn, "race:threads", f"thread-{index}", barrier)
        with lock:
            results.append(token)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len([token for token in results if token is not None]) == 1


def _process_race(args) -> int | None:
    dsn, index, barrier = args
    return _race(dsn, "race:processes", f"process-{index}", barrier)


def test_processes_racing_for_one_lease_get_exactly_one_winner(control_dsn):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with ctx.Pool(4) as pool:
            results = pool.map(_process_race, [(control_dsn, i, barrier) for i in range(4)])
    assert len([token for token in results if token is not None]) == 1


def _wait_expired(conn, lease: leases.Lease) -> None:
    for _ in range(200):
        if not leases.is_current(conn, lease):
            return
        time.sleep(0.02)
    raise AssertionError("lease did not expire by the database clock")


def test_tokens_strictly_increase_across_expiry_release_and_reacquisition(control_conn):
    short = timedelta(milliseconds=200)
    first = leases.acquire(control_conn, "tokens", "a", short)
    assert leases.acquire(control_conn, "tokens", "b", short) is None
    _wait_expired(control_conn, first)
    second = leases.acquire(control_conn, "tokens", "b", short)
    assert second.token > first.token
    assert leases.release(control_conn, second)
    third = leases.acquire(control_conn, "tokens", "a", TTL)
    assert third.token > second.token
    again = leases.acquire(control_conn, "tokens", "a", TTL)  # already ours: a new token
    assert again.token > third.token
    assert not leases.is_current(control_conn, third)


def test_a_stale_holder_can_neither_renew_nor_release(control_conn):
    stale = leases.acquire(control_conn, "stale", "a", timedelta(milliseconds=100))
    _wait_expired(control_conn, stale)
    current = leases.acquire(control_conn, "stale", "b", TTL)
    with pytest.raises(leases.LeaseLost, match="now held by 'b'"):
        leases.renew(control_conn, stale, TTL)
    assert leases.release(control_conn, stale) is False
    assert leases.is_current(control_conn, current)
    renewed = leases.renew(control_conn, current, TTL)
    assert renewed.token == current.token and renewed.expires_at >= current.expires_at


def test_an_expired_lease_cannot_be_renewed_even_by_its_owner(control_conn):
    lease = leases.acquire(control_conn, "expired", "a", timedelta(milliseconds=100))
    _wait_expired(control_conn, lease)
    with pytest.raises(leases.LeaseLost, match="expired"):
        leases.renew(control_conn, lease, TTL)


def test_expiry_is_judged_by_the_database_clock_not_the_client_clock(control_conn, monkeypatch):
    lease = leases.acquire(control_conn, "clock", "a", TTL)
    # A client whose clock runs a day ahead (or behind) must see the same answers.
    for skew in (86400.0, -86400.0):
        real_time = time.time
        monkeypatch.setattr(time, "time", lambda: real_time() + skew)
        control_conn.execute("SET TIME ZONE 'Pacific/Kiritimati'")
        assert leases.acquire(control_conn, "clock", "b", TTL) is None
        assert leases.is_current(control_conn, lease)
        monkeypatch.undo()
        control_conn.execute("SET TIME ZONE 'UTC'")
    (remaining,) = control_conn.execute(
        "SELECT expires_at - clock_timestamp() FROM leases WHERE lease_name = 'clock'"
    ).fetchone()
    assert timedelta(seconds=25) < remaining <= TTL
