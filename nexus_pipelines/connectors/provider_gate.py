"""Provider gates: one per provider origin and credential identity, persisted in the control
plane, so every worker of a drain and every process knows a provider's stated wait
(docs/design/provider-gate.md).

Before any request (poll reads and close-back writes alike) the adapter's HTTP client asks
its gate (`Gate.admit`); while a wait is in force nothing is sent and the request fails
with `GateClosed`, which the adapter reports as a throttled failure carrying the gate's
remaining wait. After any answer the gate reads the one rate-limit rule
(`rate_limits.stated_wait`) and holds the key until the stated time. The database clock
decides: a wait is stored as `now() + seconds` and compared with `now()`.

A provider with a proactive write budget (GitHub: 80 content-creating requests per minute)
also counts its writes: the writes of the last minute are kept on the row, and a write
that would exceed the budget waits for the oldest to age out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
from psycopg_pool import ConnectionPool

from nexus_pipelines.connectors.rate_limits import stated_wait
from nexus_pipelines.integrations.http import GateClosed, origin_of
from nexus_pipelines.redaction import one_line

WRITE_WINDOW = timedelta(seconds=60)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
UNREADABLE_WAIT_S = 5.0


@dataclass(frozen=True)
class GatePolicy:
    """Who a gate is (`key`: origin plus a non-secret credential identity), which statuses
    the provider refuses for limits, and its proactive write budget per minute, if any."""

    key: str
    limit_statuses: frozenset[int]
    writes_per_minute: int | None = None

    @classmethod
    def for_origin(cls, url: str, identity: str, limit_statuses: frozenset[int],
                   writes_per_minute: int | None = None) -> GatePolicy:
        return cls(f"{origin_of(url)} {identity}", limit_statuses, writes_per_minute)


@dataclass(frozen=True)
class Held:
    key: str
    until: datetime
    wait_s: float
    said: str

    def line(self) -> str:
        return f"{self.key} is held until {self.until.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ} ({self.said})"


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

    def admit(self, policy: GatePolicy, *, write: bool) -> Held | None:
        """None when a request may go out now (a budgeted write is counted), else why not."""
        with self._pool.connection() as conn:
            if not (write and policy.writes_per_minute):
                row = conn.execute(_READ, (policy.key,)).fetchone()
                return _held(policy.key, *row) if row else None
            with conn.transaction():
                conn.execute(_ENSURE, (policy.key,))
                now, until, said, recent = conn.execute(_LOCK, (policy.key,)).fetchone()
                held = _held(policy.key, now, until, said)
                if held is not None:
                    return held
                recent = sorted(t for t in recent if t > now - WRITE_WINDOW)
                if len(recent) >= policy.writes_per_minute:
                    return _held(policy.key, now, recent[-policy.writes_per_minute] + WRITE_WINDOW,
                                 f"at most {policy.writes_per_minute} writes per minute")
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
            held = self._gates.admit(self.policy, write=request.method not in SAFE_METHODS)
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
