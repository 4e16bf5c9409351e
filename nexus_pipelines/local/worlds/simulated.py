"""What every provider world shares over its simulator: faults queued per suite operation,
recorded requests named by the simulator's route, the clock."""

from __future__ import annotations

from collections.abc import Callable, Mapping

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


class SwitchTransport(httpx.BaseTransport):
    """Forwards to `inner`, which a world swaps once composition is done (a composition that
    talks to the provider does so with the simulator; the invocations then meet `inner`)."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.inner.handle_request(request)


class SimulatorWorld:
    """The half of a conformance `World` that is the same over every simulator: faults queued
    per suite operation, recorded requests named by the simulator's route, the clock.

    A provider's world sets `operations` (suite operation -> simulator operation) and
    `route` (its simulator's static route), defines `fault(name)`, and has `state` (with
    `faults` and `clock`) and `transport` (a `SimulatorTransport`)."""

    operations: Mapping[str, str]
    route: Callable  # (SimRequest) -> (operation, groups)
    fault: Callable[[str], Fault]  # a suite fault name -> the provider's answer

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
