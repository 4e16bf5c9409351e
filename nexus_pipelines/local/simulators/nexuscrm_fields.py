"""Salesforce field semantics for the NexusCRM simulator: what a describe says about a
field, and how a written value is judged, as Salesforce documents it.

A value Salesforce cannot deserialize into the field's type (a number in a text field,
a quoted number, a malformed date, a datetime without a zone) fails the *whole request*
with 400 JSON_PARSER_ERROR, as does an unknown field (400 INVALID_FIELD): `check_value`
raises `RequestRejected`. A well-typed value outside the field's limits (too long, more
digits than precision/scale allow, null in a required field) fails only its record:
`record_error` returns the per-record error.

Formats (REST API "Valid Date and DateTime Formats"): date `yyyy-MM-dd`; dateTime
`yyyy-MM-ddTHH:mm:ss(.SSS)` with `Z` or `+/-HH:mm`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from nexus_pipelines.integrations.nexuscrm import NUMBER_TYPES, FieldContract, check_checkbox

TEXT_TYPES = frozenset({"string", "textarea", "id"})
TYPES = TEXT_TYPES | NUMBER_TYPES | frozenset({"boolean", "date", "datetime"})
MAX_TEXT_LENGTH = {"string": 255, "textarea": 131072, "id": 18}
MAX_PRECISION = 18

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{3})?(Z|[+-]\d{2}:\d{2})$")


class RequestRejected(Exception):
    """The whole request fails (HTTP 400) and nothing is written."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class FieldSpec:
    """One field of an object's describe. Text fields need a length, number fields a
    precision (and scale), and a checkbox (boolean) is never nillable, as in Salesforce."""

    name: str
    type: str = "string"
    createable: bool = True
    updateable: bool = True
    external_id: bool = False
    unique: bool = False
    id_lookup: bool | None = None  # defaults to external_id, as in Salesforce
    nillable: bool = True
    length: int = 0
    precision: int = 0
    scale: int = 0

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"{self.name}: the simulator serves no field type {self.type!r}")
        if self.type in TEXT_TYPES and not 0 < self.length <= MAX_TEXT_LENGTH[self.type]:
            raise ValueError(f"{self.name}: a {self.type} field needs a length of 1..{MAX_TEXT_LENGTH[self.type]}")
        if self.type in NUMBER_TYPES and not 0 <= self.scale <= self.precision <= MAX_PRECISION or (
                self.type in NUMBER_TYPES and not self.precision):
            raise ValueError(f"{self.name}: a {self.type} field needs 1 <= precision <= {MAX_PRECISION} and a scale "
                             "no larger")
        check_checkbox(self.name, self.type, self.nillable)  # its describe says nillable: false, as Salesforce's

    @classmethod
    def from_contract(cls, contract: FieldContract, **overrides: Any) -> FieldSpec:
        spec = cls(contract.name, type=contract.type, external_id=contract.external_id, unique=contract.external_id,
                   nillable=contract.nillable, length=contract.length, precision=contract.precision,
                   scale=contract.scale)
        return replace(spec, **overrides) if overrides else spec

    @property
    def defaulted_on_create(self) -> bool:
        return self.type == "boolean"  # a checkbox is false unless set

    @property
    def required_on_create(self) -> bool:
        return not self.nillable and self.createable and not self.defaulted_on_create

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.name,
            "type": self.type,
            "custom": self.name.endswith("__c"),
            "createable": self.createable,
            "updateable": self.updateable,
            "externalId": self.external_id,
            "unique": self.unique,
            "idLookup": self.external_id if self.id_lookup is None else self.id_lookup,
            "nillable": self.nillable,
            "defaultedOnCreate": self.defaulted_on_create,
            "length": self.length,
            "precision": self.precision,
            "scale": self.scale,
        }


def check_value(spec: FieldSpec, value: Any) -> None:
    """Raise RequestRejected when `value` (as parsed from JSON, numbers as Decimal/int)
    cannot be deserialized into the field's type."""
    if value is None:
        return
    kind = spec.type
    if kind in TEXT_TYPES:
        ok = isinstance(value, str)
    elif kind in NUMBER_TYPES:
        ok = isinstance(value, (int, Decimal)) and not isinstance(value, bool)
    elif kind == "boolean":
        ok = isinstance(value, bool)
    elif kind == "date":
        ok = isinstance(value, str) and bool(_DATE.match(value)) and _parses(date.fromisoformat, value)
    else:  # datetime
        ok = isinstance(value, str) and bool(_DATETIME.match(value)) and _parses(datetime.fromisoformat, value)
    if not ok:
        raise RequestRejected(
            "JSON_PARSER_ERROR",
            f"Cannot deserialize instance of {kind} from {_token(value)} value {_text(value)} or request may be "
            f"missing a required field ({spec.name})",
        )


def record_error(spec: FieldSpec, value: Any) -> tuple[str, str] | None:
    """The per-record error for a well-typed value outside the field's limits."""
    if value is None:
        return None if spec.nillable else ("REQUIRED_FIELD_MISSING", f"Required fields are missing: [{spec.name}]")
    if spec.type in TEXT_TYPES and len(value) > spec.length:
        return "STRING_TOO_LONG", f"{spec.name}: data value too large (max length={spec.length})"
    if spec.type in NUMBER_TYPES and not _fits(Decimal(value), spec.precision, spec.scale):
        return "NUMBER_OUTSIDE_VALID_RANGE", f"{spec.name}: value outside of valid range on numeric field: {value}"
    return None


def _fits(value: Decimal, precision: int, scale: int) -> bool:
    sign, digits, exponent = value.normalize().as_tuple() if value else (0, (0,), 0)
    decimals = max(-int(exponent), 0)
    integer_digits = max(len(digits) + int(exponent), 0)
    return decimals <= scale and integer_digits <= precision - scale


def _parses(parse: Any, text: str) -> bool:
    try:
        parse(text)
    except ValueError:
        return False
    return True


def _token(value: Any) -> str:
    if isinstance(value, bool):
        return "VALUE_TRUE" if value else "VALUE_FALSE"
    if isinstance(value, int):
        return "VALUE_NUMBER_INT"
    if isinstance(value, Decimal):
        return "VALUE_NUMBER_FLOAT"
    if isinstance(value, str):
        return "VALUE_STRING"
    return "START_ARRAY" if isinstance(value, list) else "START_OBJECT"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)[:40]
