"""The strict values of the connector seam (docs/design/connector-contract.md, "The adapter
protocol and typed results").

Every value is a frozen pydantic model with `extra="forbid"`. Results carry a literal
`kind` discriminator, and the failure models refuse every reason/class/disposition
combination the contract forbids, so an adapter cannot return something core would have
to guess about. Nothing here knows a provider: identities are `kind:container:item`
strings whose parts the adapter chooses from immutable provider ids.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

MAX_ATTEMPTS = 4
DEADLINE_MS = 10_000
MAX_PAGE_SIZE = 100
CURSOR_MAX_CHARS = 1024
TITLE_MAX_CHARS = 1024
DESCRIPTION_MAX_CHARS = 1_048_576
LABEL_MAX_CHARS = 255
MAX_LABELS = 100
COMMENT_MAX_CHARS = 10_000
DETAIL_MAX_CHARS = 300

KIND_PATTERN = r"^[a-z][a-z0-9_]{1,31}$"
# kind:container:item, each part free of ':' and whitespace; e.g. gitlab:278964:42
EXTERNAL_REF_PATTERN = r"^[a-z][a-z0-9_]{1,31}:[A-Za-z0-9._-]{1,128}:[A-Za-z0-9._-]{1,128}$"
_PRINTABLE = re.compile(r"^[\x21-\x7e]+$")
# no control character but tab, line feed and carriage return: a pattern, so the validator core
# checks it without a Python call per text (a page holds hundreds of texts)
NO_CONTROL_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"

RETRYABLE_REASONS = frozenset(
    {"timeout", "transport_connect", "transport_read", "transport_protocol", "throttled", "provider_5xx"}
)
TERMINAL_REASONS = frozenset(
    {"authentication", "authorization", "ordinary_4xx", "invalid_payload", "unsupported_item", "contract_violation"}
)

Reason = Literal[
    "timeout", "transport_connect", "transport_read", "transport_protocol", "throttled", "provider_5xx",
    "authentication", "authorization", "ordinary_4xx", "invalid_payload", "unsupported_item", "contract_violation",
]
RetryClass = Literal["retryable", "terminal"]

_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("timestamps must carry a time zone")
    return value.astimezone(UTC)


def _cursor(value: str) -> str:
    if not _PRINTABLE.match(value):
        raise ValueError("a cursor token is printable ASCII without spaces")
    return value


Text = Annotated[str, Field(pattern=NO_CONTROL_PATTERN)]
AwareDatetime = Annotated[datetime, AfterValidator(_utc)]
CursorToken = Annotated[str, Field(min_length=1, max_length=CURSOR_MAX_CHARS), AfterValidator(_cursor)]
ExternalRef = Annotated[str, Field(pattern=EXTERNAL_REF_PATTERN)]
Detail = Annotated[str, Field(max_length=DETAIL_MAX_CHARS)]


class ExternalIssue(BaseModel):
    """One provider issue, normalized: the only fields core ever sees. The fields are declared in
    key order, so the model's own JSON is its canonical form (`canonical_form`)."""

    model_config = _STRICT

    connector_kind: Annotated[str, Field(pattern=KIND_PATTERN)]
    description: Annotated[Text, Field(max_length=DESCRIPTION_MAX_CHARS)]
    display_url: Annotated[str, Field(min_length=1, max_length=2048, pattern=r"^https?://[^\s]+$")]
    external_ref: ExternalRef
    external_state: Literal["open", "closed"]
    external_updated_at: AwareDatetime
    reporter_display_name: Annotated[Text, Field(max_length=255)]
    reporter_ref: Annotated[Text, Field(min_length=1, max_length=255)]
    source_labels: Annotated[
        tuple[Annotated[Text, Field(min_length=1, max_length=LABEL_MAX_CHARS)], ...], Field(max_length=MAX_LABELS)
    ]
    title: Annotated[Text, Field(min_length=1, max_length=TITLE_MAX_CHARS)]

    @model_validator(mode="after")
    def _ref_names_the_kind(self) -> Self:
        if not self.external_ref.startswith(self.connector_kind + ":"):
            raise ValueError("external_ref must start with the connector kind")
        return self


def source_version_digest(issue: ExternalIssue) -> str:
    """sha256 over the canonical JSON of the normalized value (the observation digest)."""
    return digest_of(canonical_form(issue))


def canonical_form(issue: ExternalIssue) -> str:
    """The canonical JSON the digest is taken over: keys sorted, no spaces, non-ASCII characters
    kept as they are; serialized by the validator core in one call (the fields are in key order)."""
    return issue.model_dump_json()


def digest_of(form: str) -> str:
    return "sha256:" + hashlib.sha256(form.encode()).hexdigest()


class ConnectorAttempt(BaseModel):
    """Created by core only: which of the four attempts this is and its budget snapshot."""

    model_config = _STRICT

    attempt_number: Annotated[int, Field(ge=1, le=MAX_ATTEMPTS)]
    max_attempts: Literal[4] = MAX_ATTEMPTS
    deadline_remaining_milliseconds: Annotated[int, Field(ge=1, le=DEADLINE_MS)]


class FetchIssuePage(BaseModel):
    """The opaque token (None: from the beginning) and the core-enforced page bound."""

    model_config = _STRICT

    cursor: CursorToken | None
    page_size: Annotated[int, Field(ge=1, le=MAX_PAGE_SIZE)]


class ExternalIssuePage(BaseModel):
    """A bounded page. `next_cursor` must advance whenever `issues` is non-empty;
    `excluded` counts provider items the adapter skipped by rule (GitHub pull requests);
    `rescan` says the page proved a shift under the scan (an item read twice, a short page
    behind an offset), so `next_cursor` repeats the scan from its own bound."""

    model_config = _STRICT

    kind: Literal["page"] = "page"
    issues: Annotated[tuple[ExternalIssue, ...], Field(max_length=MAX_PAGE_SIZE)]
    next_cursor: CursorToken
    exhausted: bool
    excluded: Annotated[int, Field(ge=0)] = 0
    rescan: bool = False


def _check_pair(reason: str, retry_class: str) -> None:
    allowed = RETRYABLE_REASONS if retry_class == "retryable" else TERMINAL_REASONS
    if reason not in allowed:
        raise ValueError(f"reason {reason!r} is not a {retry_class} reason")


class _Failure(BaseModel):
    """What every failure carries: its class, a reason from the closed set, a bounded detail,
    and, for throttling only, the provider's requested wait."""

    model_config = _STRICT

    retry_class: RetryClass
    reason: Reason
    detail: Detail = ""
    retry_after_seconds: Annotated[float, Field(ge=0, le=86_400)] | None = None

    @model_validator(mode="after")
    def _closed_combinations(self) -> Self:
        _check_pair(self.reason, self.retry_class)
        if self.retry_after_seconds is not None and self.reason != "throttled":
            raise ValueError("only a throttled failure carries retry_after_seconds")
        return self


class FetchFailure(_Failure):
    kind: Literal["fetch_failure"] = "fetch_failure"


class CloseExternalIssue(BaseModel):
    """The exact target, deterministic command id and marker, and the proof-derived comment.

    `reconcile_first` is set by core when an earlier invocation of this command may have
    written: the adapter must then look for the marker before it writes anything.
    """

    model_config = _STRICT

    external_ref: ExternalRef
    command_id: Annotated[str, Field(pattern=r"^close-[0-9a-f]{32}$")]
    marker: Annotated[str, Field(min_length=16, max_length=128, pattern=r"^\[nexus:close:[0-9a-f]{32}\]$")]
    comment: Annotated[Text, Field(min_length=1, max_length=COMMENT_MAX_CHARS)]
    reconcile_first: bool = False

    @model_validator(mode="after")
    def _comment_carries_marker(self) -> Self:
        if self.marker not in self.comment:
            raise ValueError("the comment must contain the marker")
        if self.command_id.removeprefix("close-") not in self.marker:
            raise ValueError("the marker must name the command")
        return self


class ConnectorReceipt(BaseModel):
    """Proof that the marked comment exists and the issue is closed."""

    model_config = _STRICT

    kind: Literal["receipt"] = "receipt"
    command_id: str
    external_ref: ExternalRef
    marker: str
    comment_ref: Annotated[str, Field(min_length=1, max_length=128)]
    closed: Literal[True] = True


class CloseFailure(_Failure):
    kind: Literal["close_failure"] = "close_failure"
    write_disposition: Literal["not_written", "reconciled_absent"]


class AmbiguousWrite(BaseModel):
    """The write may have happened and the marker lookup could not tell: never retried."""

    model_config = _STRICT

    kind: Literal["ambiguous_write"] = "ambiguous_write"
    operation: Literal["comment_and_close"] = "comment_and_close"
    reason: Literal["write_outcome_unknown"] = "write_outcome_unknown"
    write_disposition: Literal["reconciliation_inconclusive"] = "reconciliation_inconclusive"
    detail: Detail = ""


FetchIssuePageResult = ExternalIssuePage | FetchFailure
CloseExternalIssueResult = ConnectorReceipt | CloseFailure | AmbiguousWrite
ConnectorFailure = FetchFailure | CloseFailure


def first_error(exc: ValidationError) -> str:
    """Where a value broke its schema and which rule it broke (a limit says its bound), without
    echoing the value."""
    first = exc.errors(include_input=False)[0]
    control = first.get("ctx", {}).get("pattern") == NO_CONTROL_PATTERN
    message = "control characters are not allowed" if control else first["msg"]
    return f"{'.'.join(str(p) for p in first['loc'])}: {message}"[:250]
