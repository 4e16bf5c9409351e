"""The HTTP client a provider adapter holds: made the one way every adapter makes it (the
composition's transport and call counter, behind the provider gate of the adapter's
rate-limit identity), and closed with the adapter.
"""

from __future__ import annotations

import httpx

from nexus_pipelines.connectors.core.registry import ComposeContext
from nexus_pipelines.connectors.provider_gate import GatePolicy, RequestBudget
from nexus_pipelines.integrations.http import make_client

JSON_HEADERS = {"Accept": "application/json", "User-Agent": "nexus-pipelines"}


def gated_client(context: ComposeContext, url: str, identity: str, limit_statuses: frozenset[int],
                 budget: RequestBudget | None = None, **kwargs) -> httpx.Client:
    """A client for the API at `url` whose every request first passes the gate of `identity`
    there (what the provider limits: an installation, a token, an account)."""
    gate = context.gate(GatePolicy.for_origin(url, identity, limit_statuses, budget))
    return make_client(url, transport=context.transport, counter=context.counter, gate=gate, **kwargs)


class ClientOwner:
    """An adapter over one such client: closing the adapter closes it."""

    _http: httpx.Client

    def close(self) -> None:
        self._http.close()
