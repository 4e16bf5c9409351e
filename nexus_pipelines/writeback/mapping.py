"""Mapper base types, normalization helpers and the field-ownership contract
(seed 004 section 8).

A job's mapper is the single source of truth for the target object, the external
ID field, the owned fields and the source columns it reads. It is pure and
deterministic: the runner calls it once in the validation pass and again in the
write pass.

Omitted versus null: a mapper leaves a key out to keep the CRM value; it emits
`None` only for a field listed in `CLEARABLE_FIELDS` (the source owns clearing it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation, localcontext
from typing import Any, ClassVar

from nexus_pipelines.writeback.hashing import canonical_value, canonical_payload_hash

EXTERNAL_ID_COLUMN = "_outbound_external_id"
SOURCE_VERSION_COLUMN = "_outbound_source_version"
SOURCE_UPDATED_AT_COLUMN = "_outbound_source_updated_at"
FRAMEWORK_COLUMNS: dict[str, str] = {
    EXTERNAL_ID_COLUMN: "STRING",
    SOURCE_VERSION_COLUMN: "STRING",
    SOURCE_UPDATED_AT_COLUMN: "TIMESTAMP",
}

# Fields the CRM manages itself; a mapper may never emit them.
SERVER_MANAGED_FIELDS = frozenset(
    {"Id", "CreatedDate", "CreatedById", "LastModifiedDate", "LastModifiedById", "SystemModstamp", "IsDeleted", "OwnerId"}
)
_FIELD_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,79}$")

# BigQuery types a column may arrive as, by the type the mapper declares.
_COMPATIBLE_TYPES: dict[str, frozenset[str]] = {
    "STRING": frozenset({"STRING"}),
    "TIMESTAMP": frozenset({"TIMESTAMP"}),
    "DATE": frozenset({"DATE"}),
    "NUMERIC": frozenset({"NUMERIC", "BIGNUMERIC"}),
    "INT64": frozenset({"INT64", "INTEGER"}),
    "BOOL": frozenset({"BOOL", "BOOLEAN"}),
}


class MappingError(ValueError):
    """One row cannot be mapped. The message names the column or field and the rule,
    never the value (source values can be customer data)."""

    def __init__(self, external_id: str | None, field: str, reason: str) -> None:
        self.external_id = external_id
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class OwnershipError(MappingError):
    """The mapper emitted something outside its declared write contract."""


@dataclass(frozen=True)
class MappedRecord:
    external_id: str
    source_version: str | None
    payload: dict[str, Any]  # normalized values, wire-ready (Decimal as exact text)
    payload_hash: str


class Mapper:
    """Base class of a job's mapper. Subclasses set the class constants and `map_row`."""

    TARGET_OBJECT: ClassVar[str]
    EXTERNAL_ID_FIELD: ClassVar[str]
    OWNED_FIELDS: ClassVar[frozenset[str]]
    CLEARABLE_FIELDS: ClassVar[frozenset[str]] = frozenset()
    # Source columns the mapper reads, with their BigQuery type ("STRING", "NUMERIC", ...).
    SOURCE_COLUMNS: ClassVar[Mapping[str, str]]

    def map_row(self, row: Mapping[str, Any]) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- framework side -------------------------------------------------------------

    @classmethod
    def check_declaration(cls) -> None:
        """The mapper's own constants are coherent (run once when a job is registered)."""
        for name in (cls.TARGET_OBJECT, cls.EXTERNAL_ID_FIELD, *cls.OWNED_FIELDS):
            if not _FIELD_NAME.match(name):
                raise ValueError(f"{cls.__name__}: {name!r} is not a NexusCRM API name")
        if cls.EXTERNAL_ID_FIELD not in cls.OWNED_FIELDS:
            raise ValueError(f"{cls.__name__}: OWNED_FIELDS must include the external ID field")
        managed = cls.OWNED_FIELDS & SERVER_MANAGED_FIELDS
        if managed:
            raise ValueError(f"{cls.__name__}: server-managed fields cannot be owned: {sorted(managed)}")
        if not cls.CLEARABLE_FIELDS <= cls.OWNED_FIELDS:
            raise ValueError(f"{cls.__name__}: CLEARABLE_FIELDS must be owned fields")
        if cls.EXTERNAL_ID_FIELD in cls.CLEARABLE_FIELDS:
            raise ValueError(f"{cls.__name__}: the external ID field cannot be clearable")

    @classmethod
    def required_columns(cls) -> dict[str, str]:
        return {**FRAMEWORK_COLUMNS, **dict(cls.SOURCE_COLUMNS)}

    @classmethod
    def schema_problems(cls, schema: Mapping[str, str]) -> list[str]:
        """Missing or mistyped required columns, given {column: BigQuery type}."""
        problems = []
        for column, wanted in cls.required_columns().items():
            got = schema.get(column)
            if got is None:
                problems.append(f"required column {column} is missing")
            elif got.upper() not in _COMPATIBLE_TYPES.get(wanted, frozenset({wanted})):
                problems.append(f"column {column} is {got}, expected {wanted}")
        return problems

    def map_record(self, row: Mapping[str, Any]) -> MappedRecord:
        """Map one source row, enforce ownership and hash it. Raises MappingError."""
        external_id = row.get(EXTERNAL_ID_COLUMN)
        if not isinstance(external_id, str) or not external_id.strip():
            raise MappingError(None, EXTERNAL_ID_COLUMN, "external ID is null or empty")
        version = row.get(SOURCE_VERSION_COLUMN)
        if version is not None and not isinstance(version, str):
            raise MappingError(external_id, SOURCE_VERSION_COLUMN, f"expected STRING, got {type(version).__name__}")
        try:
            payload = self.map_row(row)
        except MappingError as exc:
            if exc.external_id is None:
                exc.external_id = external_id
            raise
        payload = self.check_ownership(external_id, payload)
        digest = canonical_payload_hash(self.TARGET_OBJECT, self.EXTERNAL_ID_FIELD, external_id, payload)
        return MappedRecord(external_id, version, payload, digest)

    def check_ownership(self, external_id: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(payload, Mapping):
            raise OwnershipError(external_id, "<payload>", "mapper must return a mapping")
        out: dict[str, Any] = {}
        owned, clearable = self.OWNED_FIELDS, self.CLEARABLE_FIELDS
        for key, value in payload.items():
            if key not in owned:
                reason = ("server-managed fields are never emitted" if key in SERVER_MANAGED_FIELDS
                          else "field is outside the declared OWNED_FIELDS")
                raise OwnershipError(external_id, key, reason)
            if value is None and key not in clearable:
                raise OwnershipError(external_id, key, "null emitted for a field the source does not own clearing")
            if type(value) is str or value is None:
                out[key] = value
                continue
            try:
                out[key] = canonical_value(value)
            except TypeError as exc:
                raise OwnershipError(external_id, key, str(exc)) from None
        if out.get(self.EXTERNAL_ID_FIELD) != external_id:
            raise OwnershipError(external_id, self.EXTERNAL_ID_FIELD, "must equal _outbound_external_id")
        return out


# -- normalization helpers ---------------------------------------------------------


def require(row: Mapping[str, Any], column: str, kind: type | tuple[type, ...], *, nullable: bool = False) -> Any:
    """The column's value, checked against a Python type (bool is never an int; a
    datetime is never a date)."""
    try:
        value = row[column]
    except KeyError:
        raise MappingError(None, column, "required column is missing") from None
    if value is None:
        if nullable:
            return None
        raise MappingError(None, column, "required value is null")
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if type(value) in kinds:  # the common case, exact type
        return value
    if isinstance(value, bool) and bool not in kinds:
        raise MappingError(None, column, f"expected {_names(kinds)}, got bool")
    if isinstance(value, datetime) and datetime not in kinds:
        raise MappingError(None, column, f"expected {_names(kinds)}, got datetime")
    if not isinstance(value, kinds):
        raise MappingError(None, column, f"expected {_names(kinds)}, got {type(value).__name__}")
    return value


def _names(kinds: tuple[type, ...]) -> str:
    return "/".join(k.__name__ for k in kinds)


def utc_timestamp(value: datetime, field: str) -> str:
    """UTC ISO-8601 with milliseconds and a Z suffix; naive datetimes are refused."""
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise MappingError(None, field, "timestamp must be timezone-aware")
    value = value.astimezone(UTC)
    if value.microsecond % 1000:
        raise MappingError(None, field, "timestamp has sub-millisecond precision the target would truncate")
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def iso_date(value: date, field: str) -> str:
    if isinstance(value, datetime) or not isinstance(value, date):
        raise MappingError(None, field, "expected a DATE")
    return value.isoformat()


def exact_decimal(value: Any, field: str, *, precision: int, scale: int) -> Decimal:
    """A Decimal quantized to `scale` places, refusing anything that would lose digits:
    more fractional digits than `scale` (other than zeros) or more than
    `precision - scale` integer digits. Floats are refused outright."""
    if isinstance(value, bool) or isinstance(value, float):
        raise MappingError(None, field, "binary floats are not accepted for decimals")
    if isinstance(value, int):
        value = Decimal(value)
    if isinstance(value, str):
        try:
            value = Decimal(value)
        except InvalidOperation:
            raise MappingError(None, field, "not a decimal number") from None
    if not isinstance(value, Decimal) or not value.is_finite():
        raise MappingError(None, field, "expected a finite decimal")
    quantum = Decimal(1).scaleb(-scale)
    with localcontext() as ctx:  # enough digits to quantize any finite value exactly
        ctx.prec = max(ctx.prec, value.adjusted() + scale + 2)
        quantized = value.quantize(quantum)
    if quantized != value:
        raise MappingError(None, field, f"has more than {scale} decimal places; refusing to round")
    digits = len(quantized.as_tuple().digits)
    integer_digits = max(digits - scale, 0) if quantized != 0 else 0
    if integer_digits > precision - scale:
        raise MappingError(None, field, f"exceeds precision {precision} (scale {scale})")
    return quantized


def bounded_text(value: Any, field: str, *, max_length: int, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise MappingError(None, field, f"expected STRING, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise MappingError(None, field, "empty string")
    if len(value) > max_length:
        raise MappingError(None, field, f"longer than {max_length} characters; refusing to truncate")
    return value
