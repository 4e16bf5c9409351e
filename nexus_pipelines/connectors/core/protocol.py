"""The whole adapter surface: two methods, one typed result per invocation
(docs/design/connector-contract.md, "The adapter protocol and typed results").

A connector is a structural protocol, not a base class. The composed adapter already
holds its pinned, validated provider config and its process-local credential, so
neither call carries config or a secret. An adapter never sleeps, loops or retries:
it applies a transport timeout no greater than the attempt's remaining budget and
returns one result; core (`executor.py`) decides whether another attempt happens.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from nexus_pipelines.connectors.core.values import (
    CloseExternalIssue,
    CloseExternalIssueResult,
    ConnectorAttempt,
    FetchIssuePage,
    FetchIssuePageResult,
)


@runtime_checkable
class IssueConnector(Protocol):
    def fetch_page(self, request: FetchIssuePage, attempt: ConnectorAttempt) -> FetchIssuePageResult: ...

    def comment_and_close(self, command: CloseExternalIssue, attempt: ConnectorAttempt) -> CloseExternalIssueResult: ...
