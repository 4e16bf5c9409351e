"""The strict values of the reconciliation sweep's seam: two more adapter operations, each one
transport request per invocation with a typed result, like `fetch_page`.

`list_identities` walks the container's issues in the cheapest stable order the provider
offers (immutable creation order, keyset pages where available) and returns only each
issue's identity and provider update time; items the registration does not ingest (pull
requests, excluded work types) are counted, never listed. `fetch_issue` reads one issue in
full through the adapter's strict mapping, so a re-observed gap is exactly what a poll
would have delivered.

Where the provider offers conditional requests for its listing (GitHub's `ETag` /
`If-None-Match`), the sweep stores each page it read with the page's validator and sends it
with the next sweep's request for that page; `UnchangedPage` is the provider's answer that
the page is still the one the validator names (docs/design/reconciliation-sweep.md says
why reusing the stored page is sound).
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
VALIDATOR_MAX_CHARS = 200

Validator = Annotated[str, Field(min_length=1, max_length=VALIDATOR_MAX_CHARS, pattern=r"^[\x21-\x7e]+$")]

_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)


class ListIdentities(BaseModel):
    model_config = _STRICT

    cursor: CursorToken | None  # None: the first page of the listing
    page_size: Annotated[int, Field(ge=1, le=MAX_IDENTITY_PAGE)]
    # the validator of this page as the last sweep read it: sent as a conditional request
    validator: Validator | None = None


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
    # the page's validator (its ETag), when the provider offers conditional requests
    validator: Validator | None = None


class UnchangedPage(BaseModel):
    """The provider's answer to a conditional request: the page is the one the validator names."""

    model_config = _STRICT

    kind: Literal["unchanged"] = "unchanged"
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


ListIdentitiesResult = IdentityPage | UnchangedPage | FetchFailure
FetchIssueResult = FetchedIssue | FetchFailure


@runtime_checkable
class SweepSource(Protocol):
    """What a provider offers the sweep, over its composed adapter's client and credential."""

    def list_identities(self, request: ListIdentities, attempt: ConnectorAttempt) -> ListIdentitiesResult: ...

    def fetch_issue(self, request: FetchIssue, attempt: ConnectorAttempt) -> FetchIssueResult: ...
