"""The strict values of the reconciliation sweep's seam: two more adapter operations, each one
transport request per invocation with a typed result, like `fetch_page`.

`list_identities` walks the container's issues in the cheapest stable order the provider
offers (immutable creation order, keyset pages where available) and returns only each
issue's identity and provider update time; items the registration does not ingest (pull
requests, excluded work types) are counted, never listed. `fetch_issue` reads one issue in
full through the adapter's strict mapping, so a re-observed gap is exactly what a poll
would have delivered.
"""

from __future__ import annotations

from typing import Annotated, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from nexus_pipelines.connectors.core.values import (
    AwareDatetime,
    ConnectorAttempt,
    CursorToken,
    ExternalIssue,
    ExternalRef,
    FetchFailure,
)

MAX_IDENTITY_PAGE = 100

_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)


class ListIdentities(BaseModel):
    model_config = _STRICT

    cursor: CursorToken | None  # None: the first page of the listing
    page_size: Annotated[int, Field(ge=1, le=MAX_IDENTITY_PAGE)]


class IssueIdentity(BaseModel):
    model_config = _STRICT

    external_ref: ExternalRef
    external_updated_at: AwareDatetime


class IdentityPage(BaseModel):
    """One page of the listing; `next_cursor` is None on the last page."""

    model_config = _STRICT

    kind: Literal["identities"] = "identities"
    identities: Annotated[tuple[IssueIdentity, ...], Field(max_length=MAX_IDENTITY_PAGE)]
    next_cursor: CursorToken | None
    excluded: Annotated[int, Field(ge=0)] = 0
    # the provider's clock when it answered (its Date): recent changes are judged on the
    # provider's clock, never the control plane's, which may be skewed from it
    served_at: AwareDatetime | None = None


class FetchIssue(BaseModel):
    model_config = _STRICT

    external_ref: ExternalRef


class FetchedIssue(BaseModel):
    """The issue as a poll maps it, or None when it is gone or not one the registration
    ingests (`excluded` says which)."""

    model_config = _STRICT

    kind: Literal["issue"] = "issue"
    issue: ExternalIssue | None
    excluded: bool = False


ListIdentitiesResult = IdentityPage | FetchFailure
FetchIssueResult = FetchedIssue | FetchFailure


@runtime_checkable
class SweepSource(Protocol):
    """What a provider offers the sweep, over its composed adapter's client and credential."""

    def list_identities(self, request: ListIdentities, attempt: ConnectorAttempt) -> ListIdentitiesResult: ...

    def fetch_issue(self, request: FetchIssue, attempt: ConnectorAttempt) -> FetchIssueResult: ...
