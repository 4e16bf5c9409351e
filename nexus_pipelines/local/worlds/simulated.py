"""What every provider world shares over its simulator: faults queued per suite operation,
recorded requests named by the simulator's route, the clock, the suite's issues."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

import httpx

from nexus_pipelines.local.simulators.http import Fault, TransportFault, to_sim_request

# The shared suite's transport fault names (the `World` protocol of the conformance suite) as simulator faults:
# the same for every provider, since the transport fails the same way whoever answers.
TRANSPORT_FAULTS = {
    "timeout": TransportFault.TIMEOUT_BEFORE_APPLY,
    "connect_error": TransportFault.CONNECT_ERROR,
    "read_error": TransportFault.RESET_BEFORE_RESPONSE,
    "protocol_error": TransportFault.PROTOCOL_ERROR,
    "apply_then_timeout": TransportFault.APPLY_THEN_TIMEOUT,
    "apply_then_read_error": TransportFault.APPLY_THEN_RESET,
    "apply_then_protocol_error": TransportFault.APPLY_THEN_DROP,
}
# The suite's faults every provider's simulator answers alike: the transport's, and a 5xx after applying
# (its body is the simulator's own `fault_body`).
SHARED_FAULTS = {**{name: Fault(transport=fault) for name, fault in TRANSPORT_FAULTS.items()},
                 "apply_then_5xx": Fault(after_apply_status=502)}


class SwitchTransport(httpx.BaseTransport):
    """Forwards to `inner`, which a world swaps once composition is done (a composition that
    talks to the provider does so with the simulator; the invocations then meet `inner`)."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.inner.handle_request(request)


class SimulatorWorld:
    """The half of a conformance `World` that is the same over every simulator: faults queued
    per suite operation, recorded requests named by the simulator's route, the clock, and the
    suite's issues made and retitled.

    A provider's world sets `operations` (suite operation -> simulator operation) and
    `route` (its simulator's static route), defines `provider_fault(name)`, `_add_issue` and
    `_retitle` (the suite's issue fields in its own state's names), and has `state` (with
    `faults` and `clock`) and `transport` (a `SimulatorTransport`)."""

    operations: Mapping[str, str]
    route: Callable  # (SimRequest) -> (operation, groups)
    provider_fault: Callable[[str], Fault]  # a suite fault name not in SHARED_FAULTS -> the provider's answer
    _add_issue: Callable[..., str]  # (title, *, body, labels, updated_at) -> the new issue's external ref
    _retitle: Callable[[str, str], None]  # (external ref, title)

    def fault(self, name: str) -> Fault:
        shared = SHARED_FAULTS.get(name)
        return shared if shared is not None else self.provider_fault(name)

    def add_issues(self, count: int, *, same_updated_at: bool = False, title: str = "Issue") -> list[str]:
        start = self.state.clock.now()
        refs = []
        for n in range(count):
            moment = start if same_updated_at else start + timedelta(milliseconds=n)
            refs.append(self._add_issue(f"{title} {n}", body=f"Body {n}", labels=["bug"] if n % 2 else [],
                                        updated_at=moment))
        self.state.clock.advance(1)
        return refs

    def add_issue_at(self, updated_at: datetime, *, title: str = "Issue") -> str:
        return self._add_issue(title, body="", labels=[], updated_at=updated_at)

    def update_issue(self, external_ref: str, *, title: str) -> None:
        self._retitle(external_ref, title)
        self.state.clock.advance(0.001)

    def fail_next(self, operation: str, fault: str, times: int = 1) -> None:
        self.state.faults.push(self.operations[operation], *[self.fault(fault)] * times)

    def clear_faults(self) -> None:
        self.state.faults.clear()

    def requests(self) -> list[tuple[str, str]]:
        names = {v: k for k, v in self.operations.items()}
        out = []
        for request in self.transport.requests:
            operation, _ = self.route(to_sim_request(request))
            out.append((names.get(operation, operation), request.method))
        return out

    def clear_requests(self) -> None:
        self.transport.requests.clear()

    def advance(self, seconds: float) -> None:
        self.state.clock.advance(seconds)
