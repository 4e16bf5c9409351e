"""Provider gates: one per provider origin and credential identity, persisted in the control
plane, so every worker of a drain and every process knows a provider's stated wait
(docs/design/provider-gate.md).

Before any request (poll reads and close-back writes alike) the adapter's HTTP client asks
its gate (`Gate.admit`); while a wait is in force nothing is sent and the request fails
with `GateClosed`, which the adapter reports as a throttled failure carrying the gate's
remaining wait. After any answer the gate reads the one rate-limit rule
(`rate_limits.stated_wait`) and holds the key until the stated time. The database clock
decides: a wait is stored as `now() + seconds` and compared with `now()`.

A page commit's flight also reads every gate's hold in one of its statements (`send_reading`),
and the next page, read ahead while that commit is in the air, is admitted by that reading
(`admitted_by`) instead of a read of its own: a hold written before the reading stops it.

A provider with a proactive budget (GitHub: 80 content-creating requests a minute and 500
an hour) also counts the requests that spend it, as its adapter classifies them by endpoint
(`RequestBudget.counts`; the gate never guesses from the method): their times within the
longest window are kept on the row, and a request that would exceed a window's limit waits
until the oldest of that window is a window (and a second's slack) old.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
from psycopg import Connection, Cursor
from psycopg_pool import ConnectionPool

from nexus_pipelines.connectors.rate_limits import stated_wait
from nexus_pipelines.integrations.http import ENDPOINT, GateClosed, origin_of
from nexus_pipelines.redaction import one_line

UNREADABLE_WAIT_S = 5.0
# the provider counts a request when it arrives, a little after the gate counted it: the
# oldest must be a little more than a window old before the next may go out
BUDGET_SLACK = timedelta(seconds=1)


@dataclass(frozen=True)
class RequestBudget:
    """A provider's proactive budget: at most `limit` counted requests in any `span`, for each
    `(span, limit)` of `windows`. `counts` is the provider's one rule for which requests spend
    it, by the adapter's endpoint name (None for a request that carries none); `what` names
    them in a hold's line."""

    windows: tuple[tuple[timedelta, int], ...]
    counts: Callable[[str | None], bool]
    what: str

    def wait(self, now: datetime, recent: list[datetime]) -> tuple[datetime, str] | None:
        """When a counted request may go out given the sorted times of the counted requests
        before it (None: now), and which window says so: the latest of the full windows."""
        full = [(recent[-limit] + span + BUDGET_SLACK, f"at most {limit} {self.what} per {_span(span)}")
                for span, limit in self.windows if len([t for t in recent if t > now - span]) >= limit]
        return max(full, default=None)

    @property
    def longest(self) -> timedelta:
        return max(span for span, _ in self.windows)


def _span(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    return {60: "minute", 3600: "hour"}.get(seconds, f"{seconds} s")


@dataclass(frozen=True)
class GatePolicy:
    """Who a gate is (`key`: origin plus a non-secret credential identity), which statuses
    the provider refuses for limits, and its proactive request budget, if any."""

    key: str
    limit_statuses: frozenset[int]
    budget: RequestBudget | None = None

    @classmethod
    def for_origin(cls, url: str, identity: str, limit_statuses: frozenset[int],
                   budget: RequestBudget | None = None) -> GatePolicy:
        return cls(f"{origin_of(url)} {identity}", limit_statuses, budget)

    def spends_budget(self, request: httpx.Request) -> bool:
        return self.budget is not None and self.budget.counts(request.extensions.get(ENDPOINT))


@dataclass(frozen=True)
class Held:
    key: str
    until: datetime
    wait_s: float
    said: str

    def line(self) -> str:
        return f"{self.key} is held until {self.until.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ} ({self.said})"


@dataclass(frozen=True)
class GateReading:
    """Every gate's hold as one statement read them: for each key, what an unbudgeted
    admission would have been told at that moment."""

    holds: Mapping[str, Held]

    @classmethod
    def of(cls, rows: Iterable[tuple]) -> GateReading:
        """The reading of `send_reading`'s rows."""
        return cls({key: held for key, *row in rows if (held := _held(key, *row)) is not None})

    def held(self, key: str) -> Held | None:
        return self.holds.get(key)


# the gates that hold: a key without a row here is open at the statement's now()
_READ_ALL = "SELECT gate_key, now(), held_until, held_by FROM provider_gates WHERE held_until > now()"


def send_reading(conn: Connection) -> Cursor:
    """Every gate's hold, asked in one statement on `conn` (in a pipeline: answered with its
    flight); `GateReading.of` its rows."""
    return conn.execute(_READ_ALL)


# the reading the next unbudgeted admission of this context takes instead of reading its gate
_READING: ContextVar[GateReading | None] = ContextVar("provider_gate_reading", default=None)


@contextmanager
def admitted_by(reading: GateReading) -> Iterator[None]:
    """Within it, the first unbudgeted admission is answered by `reading` (read when the request's
    work began) instead of a read of its own; every later one, such as a retry after an answer
    that held the gate, reads its gate again."""
    token = _READING.set(reading)
    try:
        yield
    finally:
        _READING.reset(token)


_ENSURE = "INSERT INTO provider_gates (gate_key) VALUES (%s) ON CONFLICT DO NOTHING"
_READ = "SELECT now(), held_until, held_by FROM provider_gates WHERE gate_key = %s"
_LOCK = "SELECT now(), held_until, held_by, recent_writes FROM provider_gates WHERE gate_key = %s FOR UPDATE"
_HOLD = """
INSERT INTO provider_gates AS g (gate_key, held_until, held_by)
VALUES (%(key)s, now() + make_interval(secs => %(secs)s), %(said)s)
ON CONFLICT (gate_key) DO UPDATE
   SET held_until = greatest(g.held_until, excluded.held_until),
       held_by = CASE WHEN g.held_until IS NULL OR excluded.held_until >= g.held_until THEN excluded.held_by
                      ELSE g.held_by END,
       updated_at = now()
"""


class ProviderGates:
    """The control plane's gates, shared by every thread of this process through `pool`."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    def gate(self, policy: GatePolicy) -> Gate:
        return Gate(self, policy)

    def admit(self, policy: GatePolicy, *, spends: bool) -> Held | None:
        """None when a request may go out now (one that `spends` the budget is counted), else why not."""
        budget = policy.budget
        if not (spends and budget):
            reading = _READING.get()
            if reading is None:
                return self.held(policy.key)
            _READING.set(None)  # it answers one admission: the next may follow an answer that held the gate
            return reading.held(policy.key)
        with self._pool.connection() as conn:
            with conn.transaction():
                conn.execute(_ENSURE, (policy.key,))
                now, until, said, recent = conn.execute(_LOCK, (policy.key,)).fetchone()
                held = _held(policy.key, now, until, said)
                if held is not None:
                    return held
                recent = sorted(t for t in recent if t > now - budget.longest)
                full = budget.wait(now, recent)
                if full is not None:
                    return _held(policy.key, now, *full)
                conn.execute("UPDATE provider_gates SET recent_writes = %s, updated_at = now() WHERE gate_key = %s",
                             ([*recent, now], policy.key))
        return None

    def hold(self, key: str, seconds: float, said: str) -> None:
        """Hold `key` for `seconds` from the database's now (a longer hold already in force stays)."""
        with self._pool.connection() as conn:
            conn.execute(_HOLD, {"key": key, "secs": max(seconds, 0.0), "said": one_line(said, 300)})

    def held(self, key: str) -> Held | None:
        with self._pool.connection() as conn:
            row = conn.execute(_READ, (key,)).fetchone()
        return _held(key, *row) if row else None


def _held(key: str, now: datetime, until: datetime | None, said: str) -> Held | None:
    if until is None or until <= now:
        return None
    return Held(key, until, (until - now).total_seconds(), said)


class Gate:
    """One policy's gate as the HTTP client's request hook (`make_client(gate=...)`)."""

    def __init__(self, gates: ProviderGates, policy: GatePolicy) -> None:
        self._gates = gates
        self.policy = policy

    def admit(self, request: httpx.Request) -> None:
        try:
            held = self._gates.admit(self.policy, spends=self.policy.spends_budget(request))
        except psycopg.OperationalError:
            # no request goes out unasked: a control plane that cannot answer holds it briefly
            raise GateClosed(f"{self.policy.key}: the provider gate could not be read (control plane unreachable); "
                             "nothing was sent", wait_s=UNREADABLE_WAIT_S, request=request) from None
        if held is not None:
            raise GateClosed(f"{held.line()}; nothing was sent", wait_s=held.wait_s, request=request)

    def observe(self, response: httpx.Response) -> None:
        if response.status_code in self.policy.limit_statuses:
            response.read()  # its message says whether a GitHub 403 is a limit (a refusal's body is small)
        wait = stated_wait(response, self.policy.limit_statuses)
        if wait is None:
            return
        try:
            self._gates.hold(self.policy.key, wait.seconds, f"HTTP {response.status_code} {wait.said}")
        except psycopg.OperationalError:
            # the answer still reaches the adapter, whose throttled result carries this wait for
            # its own work; the next request asks the gate, and a control plane that cannot
            # answer then holds it too
            pass
