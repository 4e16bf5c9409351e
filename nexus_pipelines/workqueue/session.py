"""A control-plane connection for long-running executors: it survives a Postgres restart
and retries a statement that lost a lock race.

`run(fn)` calls `fn(conn)` and, when it fails,
* with a deadlock, serialization or lock timeout error: retries it on the same
  connection after a short capped backoff (each caller's `fn` is one autocommit
  statement or one transaction, so the failed attempt wrote nothing);
* with a lost connection (server restart, network): reconnects with the one capped
  backoff until the outage outlasts `give_up_at`, reports the outage and its end
  through `on_outage`, then retries `fn`. The failed attempt may have committed (its
  answer was lost), so callers give it a `fn` that is safe to run twice, and settle
  from the database what a finalizing statement did (`claims.held`).

The first connection is no different: a session started during an outage waits for the
control plane the same way (`open()` connects at once, so a session that is idle at
first, like a heartbeat's, holds its connection before the outage begins).
`when_reachable` waits the same way for whatever else must connect first (a pool).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
from psycopg import Connection, errors
from psycopg_pool import ConnectionPool, PoolTimeout

from nexus_pipelines.control.db import connect
from nexus_pipelines.redaction import one_line
from nexus_pipelines.workqueue.retry import RetryPolicy

T = TypeVar("T")

LOCK_RACE_ERRORS = (errors.DeadlockDetected, errors.SerializationFailure, errors.LockNotAvailable)
_LOCK_RACE_BACKOFF = RetryPolicy(base_s=0.01, cap_s=0.5, jitter=0.5)
_RECONNECT_BACKOFF = RetryPolicy(base_s=0.1, cap_s=2.0, jitter=0.5)
CONNECT_TIMEOUT_S = 5
DEFAULT_MAX_OUTAGE_S = 60.0


class ControlPlaneUnavailable(RuntimeError):
    """The control plane stayed unreachable longer than the caller could wait."""


class ControlSession:
    """One connection (from a DSN or a pool) that `run` keeps usable across outages."""

    def __init__(
        self,
        source: str | ConnectionPool,
        *,
        give_up_at: Callable[[], float | None] = lambda: None,
        on_outage: Callable[[str], None] | None = None,
        name: str = "control plane",
    ) -> None:
        self._source = source
        self._give_up_at = give_up_at
        self._on_outage = on_outage or (lambda message: None)
        self._name = name
        self._conn: Connection | None = None
        self._lost_reason: str | None = None
        self.outages = 0
        self.outage_s = 0.0
        self.statement_retries = 0

    def run(self, fn: Callable[[Connection], T]) -> T:
        races = 0
        first_race = 0.0
        while True:
            conn = self._connection()
            try:
                return fn(conn)
            except psycopg.OperationalError as exc:
                if conn.closed or conn.broken:
                    self._lost(conn, exc)
                    continue
                if not isinstance(exc, LOCK_RACE_ERRORS):
                    raise
                races += 1
                first_race = first_race or time.monotonic()
                if time.monotonic() >= self._limit(first_race):
                    raise
                self.statement_retries += 1
                time.sleep(_LOCK_RACE_BACKOFF.delay(races))

    def open(self) -> None:
        """Connect now (waiting out an outage within `give_up_at`), not at the first `run`."""
        self._connection()

    def close(self) -> None:
        if self._conn is not None:
            self._release(self._conn)
            self._conn = None

    # --- connections -------------------------------------------------------------------

    def _connection(self) -> Connection:
        if self._conn is None:
            if self._lost_reason is not None:
                self._conn = self._reconnect(f"connection lost ({self._lost_reason})", self._open_checked)
            else:
                try:
                    self._conn = self._open()
                except (psycopg.OperationalError, PoolTimeout) as exc:
                    self._conn = self._reconnect(f"cannot connect ({_reason(exc)})", self._open_checked)
        return self._conn

    def _limit(self, since: float) -> float:
        limit = self._give_up_at()
        return since + DEFAULT_MAX_OUTAGE_S if limit is None else limit

    def _open(self) -> Connection:
        if isinstance(self._source, ConnectionPool):
            return self._source.getconn(timeout=CONNECT_TIMEOUT_S)
        return connect(self._source, connect_timeout=CONNECT_TIMEOUT_S)

    def _open_checked(self) -> Connection:
        conn = self._open()
        if isinstance(self._source, ConnectionPool):
            try:
                self._source.check_connection(conn)  # an idle pooled connection may be dead too
            except psycopg.OperationalError:
                self._release(conn)
                raise
        return conn

    def _release(self, conn: Connection) -> None:
        if isinstance(self._source, ConnectionPool):
            self._source.putconn(conn)  # the pool discards a broken connection
        else:
            conn.close()

    def _lost(self, conn: Connection, exc: BaseException) -> None:
        self._release(conn)
        self._conn = None
        self._lost_reason = _reason(exc)

    def _reconnect(self, what: str, open_conn: Callable[[], Connection]) -> Connection:
        started = time.monotonic()
        self.outages += 1
        try:
            conn = _wait_out(open_conn, what, started, lambda: self._limit(started), self._on_outage, self._name)
        finally:
            self.outage_s += time.monotonic() - started
        self._lost_reason = None
        return conn


def when_reachable(open_fn: Callable[[], T], *, give_up_at: float, on_outage: Callable[[str], None],
                   name: str = "control plane") -> T:
    """`open_fn()` (say, opening a pool) once the control plane answers: an outage is waited
    out with the reconnect backoff, reported through `on_outage`, until `give_up_at`."""
    try:
        return open_fn()
    except (psycopg.OperationalError, PoolTimeout) as exc:
        return _wait_out(open_fn, f"cannot connect ({_reason(exc)})", time.monotonic(), lambda: give_up_at,
                         on_outage, name)


def _wait_out(open_fn: Callable[[], T], what: str, started: float, limit: Callable[[], float],
              on_outage: Callable[[str], None], name: str) -> T:
    """Retry `open_fn` with capped backoff until it works (reported) or `limit()` passes
    (ControlPlaneUnavailable, one line with the last reason)."""
    on_outage(f"{name}: {what}; reconnecting with backoff")
    attempt = 0
    while True:
        attempt += 1
        try:
            result = open_fn()
        except (psycopg.OperationalError, PoolTimeout) as exc:
            reason, deadline = _reason(exc), limit()
            if time.monotonic() >= deadline:
                raise ControlPlaneUnavailable(
                    f"{name}: control plane unreachable for {time.monotonic() - started:.0f}s ({reason}); giving up"
                ) from None
            time.sleep(min(_RECONNECT_BACKOFF.delay(attempt), max(deadline - time.monotonic(), 0.01)))
            continue
        on_outage(f"{name}: reconnected after {time.monotonic() - started:.1f}s ({attempt} attempt(s))")
        return result


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return one_line(text.splitlines()[-1] if text else type(exc).__name__, 200)
