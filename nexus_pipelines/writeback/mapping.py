"""Mapper base types, normalization helpers and the field-ownership contract
(docs/design/writeback-run.md, "Mapping and the payload hash").

A job's mapper is the single source of truth for the target object, the owned fields
with their type and limits (`FIELDS`, one `FieldContract` each, the external ID field
among them), and the source columns it reads. The same declaration is compared with
the CRM's describe in the preflight, bounds every value the mapper emits (text length
and control characters, date formats, decimal precision/scale) and builds the
simulator's object. The mapper is pure and deterministic: the runner calls it once in
the validation pass and again in the write pass.

Omitted versus null: a mapper leaves a key out to keep the CRM value; it emits
`None` only for a field listed in `CLEARABLE_FIELDS` (the source owns clearing it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, date, datetime
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal, InvalidOperation
from functools import cache, lru_cache
from typing import Any, ClassVar, NamedTuple

from nexus_pipelines.integrations.nexuscrm import NUMBER_TYPES, FieldContract
from nexus_pipelines.redaction import CONTROL_CHARACTERS
from nexus_pipelines.writeback.hashing import canonical_payload_hash

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
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_UTC_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{3})?Z$")

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


class MappedRecord(NamedTuple):
    """One validated row (a named tuple: the validation pass builds one per row, and a
    frozen dataclass cost as much to build as a field check)."""

    external_id: str
    source_version: str | None
    payload: dict[str, Any]  # normalized values, wire-ready (Decimal as exact text)
    payload_hash: str


class Mapper:
    """Base class of a job's mapper. Subclasses set TARGET_OBJECT, FIELDS,
    CLEARABLE_FIELDS, SOURCE_COLUMNS and `map_row`; OWNED_FIELDS and EXTERNAL_ID_FIELD
    follow from FIELDS."""

    TARGET_OBJECT: ClassVar[str]
    FIELDS: ClassVar[tuple[FieldContract, ...]]
    CLEARABLE_FIELDS: ClassVar[frozenset[str]] = frozenset()
    # Source columns the mapper reads, with their BigQuery type ("STRING", "NUMERIC", ...).
    SOURCE_COLUMNS: ClassVar[Mapping[str, str]]
    OWNED_FIELDS: ClassVar[frozenset[str]]
    EXTERNAL_ID_FIELD: ClassVar[str]
    _CONTRACT: ClassVar[dict[str, FieldContract]]
    _CHECKS: ClassVar[dict[str, tuple[FieldContract, Any]]]  # field -> (contract, its value check)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "FIELDS" in cls.__dict__:
            cls._CONTRACT = {f.name: f for f in cls.FIELDS}
            cls._CHECKS = {f.name: (f, _VALUE_CHECKS[f.type]) for f in cls.FIELDS}
            cls.OWNED_FIELDS = frozenset(cls._CONTRACT)
            keys = [f.name for f in cls.FIELDS if f.external_id]
            cls.EXTERNAL_ID_FIELD = keys[0] if len(keys) == 1 else ""

    def map_row(self, row: Mapping[str, Any]) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- framework side -------------------------------------------------------------

    @classmethod
    def check_declaration(cls) -> None:
        """The mapper's own constants are coherent (run once when a job is registered)."""
        if not _FIELD_NAME.match(cls.TARGET_OBJECT):
            raise ValueError(f"{cls.__name__}: {cls.TARGET_OBJECT!r} is not a NexusCRM API name")
        if len(cls._CONTRACT) != len(cls.FIELDS):
            raise ValueError(f"{cls.__name__}: FIELDS declares a field twice")
        if not cls.EXTERNAL_ID_FIELD:
            raise ValueError(f"{cls.__name__}: FIELDS must declare exactly one external ID field")
        managed = cls.OWNED_FIELDS & SERVER_MANAGED_FIELDS
        if managed:
            raise ValueError(f"{cls.__name__}: server-managed fields cannot be owned: {sorted(managed)}")
        if cls.EXTERNAL_ID_FIELD in cls.CLEARABLE_FIELDS:
            raise ValueError(f"{cls.__name__}: the external ID field cannot be clearable")
        if not cls.CLEARABLE_FIELDS <= cls.OWNED_FIELDS:
            raise ValueError(f"{cls.__name__}: CLEARABLE_FIELDS must be owned fields")
        if any(not cls._CONTRACT[name].nillable for name in cls.CLEARABLE_FIELDS):
            raise ValueError(f"{cls.__name__}: a clearable field must be declared nillable")

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
        # Both go into the ledger, where Postgres refuses NUL.
        problem = _control_problem(external_id)
        if problem:
            raise MappingError(external_id, EXTERNAL_ID_COLUMN, problem)
        problem = _control_problem(version) if version else None
        if problem:
            raise MappingError(external_id, SOURCE_VERSION_COLUMN, problem)
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
        """The payload inside the declared ownership and field contract, values unchanged
        (Decimal stays Decimal: it goes out as an exact JSON number)."""
        if type(payload) is not dict and not isinstance(payload, Mapping):
            raise OwnershipError(external_id, "<payload>", "mapper must return a mapping")
        checks, clearable = self._CHECKS, self.CLEARABLE_FIELDS
        for key, value in payload.items():
            check = checks.get(key)
            if check is None:
                reason = ("server-managed fields are never emitted" if key in SERVER_MANAGED_FIELDS
                          else "field is outside the declared OWNED_FIELDS")
                raise OwnershipError(external_id, key, reason)
            if value is None:
                if key not in clearable:
                    raise OwnershipError(external_id, key, "null emitted for a field the source does not own clearing")
                continue
            spec, problem_of = check
            problem = problem_of(value, spec)
            if problem:
                raise MappingError(external_id, key, problem)
        if payload.get(self.EXTERNAL_ID_FIELD) != external_id:
            raise OwnershipError(external_id, self.EXTERNAL_ID_FIELD, "must equal _outbound_external_id")
        return dict(payload)


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


# A run's rows share few timestamps (a load stamps its rows alike): each distinct one is
# checked and formatted once. Only plain datetimes are kept (a subclass may compare otherwise);
# a naive one never equals an aware key, so it is still refused below. A dict, not the
# `lru_cache(typed=True)` the date checks use: mapping 100,000 rows cost about 3 us a row more
# with it.
_UTC_TEXT: dict[datetime, str] = {}
_UTC_TEXT_LIMIT = 4096


def utc_timestamp(value: datetime, field: str) -> str:
    """UTC ISO-8601 with milliseconds and a Z suffix; naive datetimes are refused."""
    text = _UTC_TEXT.get(value) if type(value) is datetime else None
    if text is not None:
        return text
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise MappingError(None, field, "timestamp must be timezone-aware")
    if value.tzinfo is not UTC:  # BigQuery's client already answers in UTC
        value = value.astimezone(UTC)
    if value.microsecond % 1000:
        raise MappingError(None, field, "timestamp has sub-millisecond precision the target would truncate")
    # its fields formatted: at less than half the cost of an aware datetime's isoformat()
    text = "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ" % (value.year, value.month, value.day, value.hour, value.minute,
                                                    value.second, value.microsecond // 1000)
    if type(value) is datetime:
        if len(_UTC_TEXT) >= _UTC_TEXT_LIMIT:
            _UTC_TEXT.clear()
        _UTC_TEXT[value] = text
    return text


def iso_date(value: date, field: str) -> str:
    if type(value) is not date and (isinstance(value, datetime) or not isinstance(value, date)):
        raise MappingError(None, field, "expected a DATE")
    return value.isoformat()


def exact_decimal(value: Any, field: str, *, precision: int, scale: int) -> Decimal:
    """A Decimal quantized to `scale` places, refusing anything that would lose digits:
    more fractional digits than `scale` (other than zeros) or more than
    `precision - scale` integer digits. Floats are refused outright."""
    if type(value) is not Decimal:  # the warehouse's NUMERIC arrives as Decimal
        value = _as_decimal(value, field)
    if not value.is_finite():
        raise MappingError(None, field, "expected a finite decimal")
    # The common case without building the digit tuple: with its integer digits bounded
    # first (so quantizing never builds a huge number), a value that quantizes to itself
    # loses no digit.
    if not value or value.adjusted() < precision - scale:
        exact = value.quantize(_quantum(scale), context=_EXACT)
        if exact == value:
            return exact
    problem = _decimal_problem(value, precision, scale)
    if problem:
        raise MappingError(None, field, problem)
    # Exact now: the checks above bound the result to `precision` digits.
    return value.quantize(_quantum(scale), context=_EXACT)


def _as_decimal(value: Any, field: str) -> Decimal:
    if isinstance(value, bool) or isinstance(value, float):
        raise MappingError(None, field, "binary floats are not accepted for decimals")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, str):
        try:
            return Decimal(value)
        except InvalidOperation:
            raise MappingError(None, field, "not a decimal number") from None
    if not isinstance(value, Decimal):
        raise MappingError(None, field, "expected a finite decimal")
    return value


# Wide enough that quantizing a value the checks accepted never rounds or traps.
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)


@cache
def _quantum(scale: int) -> Decimal:
    return Decimal(1).scaleb(-scale)


def _decimal_problem(value: Decimal, precision: int, scale: int) -> str | None:
    """Why a finite Decimal does not fit NUMBER(precision, scale) without rounding, or None."""
    # The common case without building the digit tuple: exactly `scale` places, and the
    # integer digits (adjusted() + 1 of a non-zero value) within precision - scale.
    if value.same_quantum(_quantum(scale)) and (not value or value.adjusted() < precision - scale):
        return None
    _, digits, exponent = value.as_tuple()
    decimals = max(-exponent, 0)
    if decimals > scale and any(digits[max(len(digits) - decimals + scale, 0):]):
        return f"has more than {scale} decimal places; refusing to round"
    if any(digits) and len(digits) + exponent > precision - scale:
        return f"exceeds precision {precision} (scale {scale})"
    return None


def _control_problem(text: str) -> str | None:
    if text.isprintable():  # every control character is unprintable; a printable text has none
        return None
    match = CONTROL_CHARACTERS.search(text)
    return f"contains a control character (U+{ord(match.group()):04X})" if match else None


def _text_problem(value: Any, spec: FieldContract) -> str | None:
    if type(value) is str and 0 < len(value) <= spec.length and value.isprintable():
        return None  # the common case in one test (a printable text holds no control character)
    if type(value) is not str:
        return f"expected text, got {type(value).__name__}"
    if not value:
        return "empty string (the CRM stores it as null; emit None to clear a clearable field)"
    if len(value) > spec.length:
        return f"longer than {spec.length} characters; refusing to truncate"
    return _control_problem(value)


def _number_problem(value: Any, spec: FieldContract) -> str | None:
    if type(value) is not Decimal:
        if isinstance(value, bool) or not isinstance(value, (Decimal, int)):
            return f"expected a number (Decimal or int), got {type(value).__name__}"
        value = Decimal(value)
    if not value.is_finite():
        return "expected a finite decimal"
    return _decimal_problem(value, spec.precision, spec.scale)


def _well_formed(value: Any, pattern: re.Pattern[str], parse: Any) -> bool:
    """Text in `pattern`'s shape that `parse` accepts (a real calendar date and time)."""
    if not pattern.match(value):
        return False
    try:
        parse(value)
    except ValueError:
        return False
    return True


# Rows of a run share few dates and times (a month, a load's timestamp): each distinct
# text is parsed once.
@lru_cache(maxsize=4096)
def _well_formed_date(text: str) -> bool:
    return _well_formed(text, _DATE, date.fromisoformat)


@lru_cache(maxsize=4096)
def _well_formed_datetime(text: str) -> bool:
    return _well_formed(text, _UTC_DATETIME, datetime.fromisoformat)


def _date_problem(value: Any, spec: FieldContract) -> str | None:
    if type(value) is str and _well_formed_date(value):
        return None
    return "expected a date as YYYY-MM-DD"


def _datetime_problem(value: Any, spec: FieldContract) -> str | None:
    if type(value) is str and _well_formed_datetime(value):
        return None
    return "expected a UTC datetime as YYYY-MM-DDTHH:MM:SS.sssZ"


def _boolean_problem(value: Any, spec: FieldContract) -> str | None:
    return None if type(value) is bool else f"expected a boolean, got {type(value).__name__}"


_VALUE_CHECKS = {"string": _text_problem, "date": _date_problem, "datetime": _datetime_problem,
                 "boolean": _boolean_problem, **{kind: _number_problem for kind in NUMBER_TYPES}}
