"""What a provider binds to the shared conformance suite: a `World` per test.

A world is one fresh provider simulator with one container (project, repository,
site) and a credential, reached through an in-process transport. The suite speaks only
the provider-neutral operations and fault names below; each provider's harness maps
them onto its own simulator (its endpoints, status codes and headers). Binding a new
provider means writing that mapping, never editing the suite.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import httpx

from nexus_pipelines.connectors.core.protocol import IssueConnector
from nexus_pipelines.connectors.core.registration import Registration

# Operations a fault can target.
OPERATIONS = ("list", "comment", "close", "lookup", "read_issue")
# Faults: every one applies nothing unless its name starts with "apply_then_".
FAULTS = (
    "timeout",  # the read timed out before the server applied anything
    "connect_error",  # httpx.ConnectError: nothing reached the server
    "read_error",  # httpx.ReadError: reset before the response; not applied
    "protocol_error",  # httpx.RemoteProtocolError before the response; not applied
    "throttled",  # the provider's rate-limit answer with a short wait
    "throttled_long",  # the provider's rate-limit answer asking for a wait longer than the deadline
    "provider_5xx",  # a 5xx; nothing applied
    "authentication",  # the provider's 401
    "authorization",  # the provider's 403 for a missing permission
    "ordinary_4xx",  # a 404/422-style refusal
    "invalid_payload",  # a 200 whose body breaks the provider's schema (listing only)
    "apply_then_timeout",  # applied, then the read timed out
    "apply_then_read_error",  # applied, then the connection was reset
    "apply_then_protocol_error",  # applied, then the connection dropped mid-response
    "apply_then_5xx",  # applied, then a 5xx came back
)


class World(Protocol):
    kind: str
    transport: httpx.BaseTransport
    environ: Mapping[str, str]  # the deployment's secret source: credential references resolve here
    secret_values: tuple[str, ...]  # every credential value, for secret canaries

    def registration(self, *, key: str = "conformance", tenant: str = "acme", project: str = "conformance",
                     page_size: int = 100) -> Registration: ...

    def adapter(self, registration: Registration | None = None,
                transport: httpx.BaseTransport | None = None) -> IssueConnector:
        """The adapter composed through the static registry (over `transport` if given, e.g. a wrapper)."""

    def add_issues(self, count: int, *, same_updated_at: bool = False, title: str = "Issue") -> list[str]:
        """Create issues (ascending update times unless `same_updated_at`); returns their external refs."""

    def update_issue(self, external_ref: str, *, title: str) -> None: ...

    def add_excluded_item(self) -> None:
        """An item the provider lists with issues that the connector must skip (a GitHub pull request,
        a GitLab task); a provider without such items adds one its connector is configured to skip."""

    def issue_state(self, external_ref: str) -> str:
        """'open' or 'closed' at the provider."""

    def comments(self, external_ref: str) -> list[str]: ...

    def add_comment(self, external_ref: str, body: str) -> None:
        """A comment written at the provider by someone else (for marker-lookup cases)."""

    def fail_next(self, operation: str, fault: str, times: int = 1) -> None: ...

    def clear_faults(self) -> None: ...

    def requests(self) -> list[tuple[str, str]]:
        """(operation, method) of every request the transport received, in order."""

    def clear_requests(self) -> None: ...

    def advance(self, seconds: float) -> None:
        """Move the provider's clock forward."""
