"""Mapper ownership, type conversion, null-vs-omit, and canonical payload hashing."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nexus_pipelines.integrations.nexuscrm import FieldContract
from nexus_pipelines.settings import PROJECT_ROOT
from nexus_pipelines.writeback.hashing import HashInputError, canonical_json, canonical_payload_hash, payload_hash
from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper
from nexus_pipelines.writeback.mapping import (
    Mapper,
    MappingError,
    _number_problem,
    _text_problem,
    exact_decimal,
    utc_timestamp,
)

M = MonthEndArrMapper()


def row(**overrides):
    base = {
        "_outbound_external_id": "001000000000001:2025-03",
        "_outbound_source_version": "load-1@2026-11-01T00:00:00.000000Z",
        "_outbound_source_updated_at": datetime(2026, 11, 1, 2, 3, 4, 5000, tzinfo=UTC),
        "account_id": "001000000000001",
        "month_start": date(2025, 3, 1),
        "arr_amount": Decimal("1234.500"),
        "currency_code": "USD",
        "product_line": "Cloud",
    }
    base.update(overrides)
    return base


def test_month_end_arr_maps_a_row():
    rec = M.map_record(row())
    assert rec.external_id == "001000000000001:2025-03"
    assert rec.payload == {
        "Month_End_ARR_Key__c": "001000000000001:2025-03",
        "Account_External_Id__c": "001000000000001",
        "Month__c": "2025-03-01",
        "ARR_Amount__c": Decimal("1234.50"),  # an exact JSON number on the wire
        "Currency_Code__c": "USD",
        "Product_Line__c": "Cloud",
        "Source_Updated_At__c": "2026-11-01T02:03:04.005Z",
    }
    assert set(rec.payload) <= M.OWNED_FIELDS
    assert rec.source_version.startswith("load-1")


def test_null_product_line_is_an_explicit_clear_but_other_nulls_fail():
    rec = M.map_record(row(product_line=None))
    assert "Product_Line__c" in rec.payload and rec.payload["Product_Line__c"] is None
    assert rec.payload_hash != M.map_record(row()).payload_hash
    with pytest.raises(MappingError, match="currency_code"):
        M.map_record(row(currency_code=None))


def test_omitted_and_null_hash_differently():
    payload = {"Month_End_ARR_Key__c": "k", "Product_Line__c": None}
    omitted = {"Month_End_ARR_Key__c": "k"}
    assert payload_hash("O", "Month_End_ARR_Key__c", "k", payload) != payload_hash("O", "Month_End_ARR_Key__c", "k", omitted)


@pytest.mark.parametrize("column,value,message", [
    ("arr_amount", 1234.5, "expected Decimal/int, got float"),
    ("arr_amount", "1234.5", "expected Decimal/int, got str"),
    ("arr_amount", Decimal("1.005"), "more than 2 decimal places"),
    ("arr_amount", Decimal("100000000000000.00"), "exceeds precision"),
    ("account_id", "0" * 19, "does not match"),
    ("account_id", 42, "expected str"),
    ("month_start", date(2025, 3, 2), "first day"),
    ("month_start", datetime(2025, 3, 1, tzinfo=UTC), "got datetime"),
    ("currency_code", "XXX", "currency"),
    ("_outbound_source_updated_at", datetime(2026, 1, 1), "timezone-aware"),
    ("_outbound_source_updated_at", datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=UTC), "sub-millisecond"),
    ("_outbound_external_id", "001000000000001:2025-04", "does not match"),
    ("_outbound_external_id", "", "null or empty"),
])
def test_invalid_inputs_are_rejected_without_echoing_values(column, value, message):
    with pytest.raises(MappingError, match=message) as info:
        M.map_record(row(**{column: value}))
    if isinstance(value, str) and len(value) > 3:
        assert value not in str(info.value)


def test_missing_required_column_is_rejected():
    data = row()
    del data["currency_code"]
    with pytest.raises(MappingError, match="currency_code: required column is missing"):
        M.map_record(data)


def test_timestamps_are_normalized_to_utc():
    plus2 = timezone(timedelta(hours=2))
    assert utc_timestamp(datetime(2026, 1, 1, 2, 0, tzinfo=plus2), "f") == "2026-01-01T00:00:00.000Z"


def test_decimals_never_go_through_floats():
    assert exact_decimal(Decimal("0.10"), "f", precision=16, scale=2) == Decimal("0.10")
    assert exact_decimal(Decimal("12345678901234.99"), "f", precision=16, scale=2) == Decimal("12345678901234.99")
    assert exact_decimal(7, "f", precision=16, scale=2) == Decimal("7.00")
    with pytest.raises(MappingError):
        exact_decimal(0.1, "f", precision=16, scale=2)
    with pytest.raises(HashInputError):
        payload_hash("O", "K", "k", {"K": "k", "x": 0.1})


def test_a_decimal_beyond_the_default_context_precision_is_a_mapping_error():
    # A NUMERIC with 27 integer digits: quantizing it to 2 places needs 29 significant digits.
    with pytest.raises(MappingError, match="exceeds precision 16"):
        exact_decimal(Decimal("9" * 27), "ARR_Amount__c", precision=16, scale=2)
    with pytest.raises(MappingError, match="exceeds precision 16"):
        exact_decimal(Decimal("1E+40"), "ARR_Amount__c", precision=16, scale=2)
    assert exact_decimal(Decimal("12.5"), "ARR_Amount__c", precision=16, scale=2) == Decimal("12.50")


def test_a_decimal_wider_than_the_default_context_is_quantized_exactly():
    assert exact_decimal(Decimal("1" * 36 + ".5"), "f", precision=40, scale=3) == Decimal("1" * 36 + ".500")
    assert exact_decimal(Decimal("0E+40"), "f", precision=16, scale=2) == Decimal("0.00")
    with pytest.raises(MappingError, match="more than 2 decimal places"):
        exact_decimal(Decimal("0.0010"), "f", precision=16, scale=2)


def test_a_timestamp_formatted_once_still_refuses_its_naive_and_sub_millisecond_neighbours():
    loaded = datetime(2026, 11, 30, 23, 0, 0, 125000, tzinfo=UTC)
    assert utc_timestamp(loaded, "f") == "2026-11-30T23:00:00.125Z"
    assert utc_timestamp(loaded.astimezone(timezone(timedelta(hours=-5))), "f") == "2026-11-30T23:00:00.125Z"
    with pytest.raises(MappingError, match="timezone-aware"):
        utc_timestamp(loaded.replace(tzinfo=None), "f")
    with pytest.raises(MappingError, match="sub-millisecond"):
        utc_timestamp(loaded + timedelta(microseconds=1), "f")


def test_a_timestamp_before_year_1000_keeps_four_year_digits():
    assert utc_timestamp(datetime(999, 1, 2, 3, 4, 5, 6000, tzinfo=UTC), "f") == "0999-01-02T03:04:05.006Z"


@given(st.datetimes(timezones=st.just(UTC)).map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)))
def test_a_utc_timestamp_is_its_isoformat_to_the_millisecond_with_a_z(value):
    assert utc_timestamp(value, "f") == value.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Rogue(Mapper):
    TARGET_OBJECT = "Month_End_ARR__c"
    FIELDS = (FieldContract("Month_End_ARR_Key__c", "string", length=40, nillable=False, external_id=True),
              FieldContract("A__c", "string", length=5), FieldContract("On__c", "date"),
              FieldContract("At__c", "datetime"), FieldContract("N__c", "double", precision=4, scale=1),
              FieldContract("Flag__c", "boolean", nillable=False))
    SOURCE_COLUMNS = {}

    def __init__(self, extra):
        self.extra = extra

    def map_row(self, r):
        return {"Month_End_ARR_Key__c": r["_outbound_external_id"], **self.extra}


@pytest.mark.parametrize("extra,message", [
    ({"B__c": 1}, "outside the declared OWNED_FIELDS"),
    ({"Id": "a0M1"}, "server-managed"),
    ({"LastModifiedDate": "2026-01-01"}, "server-managed"),
    ({"A__c": None}, "does not own clearing"),
    ({"A__c": 1.5}, "float"),
    # values checked against the declared field contract
    ({"A__c": "toolong"}, "longer than 5 characters"),
    ({"A__c": 7}, "expected text"),
    ({"A__c": ""}, "empty string"),
    ({"A__c": "a\x00b"}, "control character"),
    ({"On__c": "2025-1-1"}, "expected a date"),
    ({"On__c": "2025-02-30"}, "expected a date"),
    ({"At__c": "2025-01-01T00:00:00"}, "expected a UTC datetime"),
    ({"N__c": Decimal("1000")}, "exceeds precision 4"),
    ({"N__c": Decimal("1.25")}, "more than 1 decimal places"),
    ({"N__c": Decimal("0.0010")}, "more than 1 decimal places"),  # a trailing zero hides the digit
    ({"N__c": "1.5"}, "expected a number"),
    ({"Flag__c": 1}, "expected a boolean"),
])
def test_mapper_emitting_outside_its_ownership_or_field_contract_is_rejected(extra, message):
    with pytest.raises(MappingError, match=message):
        Rogue(extra).map_record({"_outbound_external_id": "k"})


def test_values_inside_the_declared_contract_are_emitted_unchanged():
    record = Rogue({"A__c": "ok", "On__c": "2025-02-28", "At__c": "2025-01-01T00:00:00.000Z",
                    "N__c": Decimal("123.4"), "Flag__c": False}).map_record({"_outbound_external_id": "k"})
    assert record.payload["N__c"] == Decimal("123.4") and record.payload["Flag__c"] is False


def test_mapper_declarations_are_checked():
    MonthEndArrMapper.check_declaration()

    class Bad(Rogue):
        FIELDS = (*Rogue.FIELDS, FieldContract("Id", "string", length=18))

    with pytest.raises(ValueError, match="server-managed"):
        Bad.check_declaration()

    class Unclearable(Rogue):
        CLEARABLE_FIELDS = frozenset({"Month_End_ARR_Key__c"})

    with pytest.raises(ValueError, match="external ID field cannot be clearable"):
        Unclearable.check_declaration()


def test_a_nillable_checkbox_is_refused_where_it_is_declared():
    # Salesforce never lets a checkbox be null: it is false unless set
    with pytest.raises(ValueError, match="Flag__c: a boolean .checkbox. field is never nillable in Salesforce"):
        FieldContract("Flag__c", "boolean")
    assert not FieldContract("Flag__c", "boolean", nillable=False).nillable


def test_the_mapper_declares_each_owned_field_once_with_its_type_and_limits():
    fields = {f.name: f for f in MonthEndArrMapper.FIELDS}
    assert len(fields) == len(MonthEndArrMapper.FIELDS) and set(fields) == MonthEndArrMapper.OWNED_FIELDS
    assert MonthEndArrMapper.EXTERNAL_ID_FIELD == "Month_End_ARR_Key__c" and fields["Month_End_ARR_Key__c"].external_id
    assert fields["ARR_Amount__c"] == FieldContract("ARR_Amount__c", "currency", precision=16, scale=2)
    assert (fields["Account_External_Id__c"].type, fields["Account_External_Id__c"].length) == ("string", 18)
    assert fields["Product_Line__c"].nillable  # clearable, so the CRM must allow null


def test_production_code_never_imports_the_simulators():
    root = PROJECT_ROOT / "nexus_pipelines"
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p.relative_to(root).parts[0] != "local" and "local.simulators" in p.read_text()]
    assert offenders == []


@pytest.mark.parametrize("column,field", [
    ("product_line", "Product_Line__c"),
    ("account_id", "_outbound_external_id"),  # the key is built from the account id
])
@pytest.mark.parametrize("char", ["\x00", "\x07", "\x1b", "\ud800"])
def test_control_characters_in_text_are_a_mapping_error_naming_the_row_and_field(column, field, char):
    data = row()
    data[column] = data[column][:4] + char + data[column][4:]
    if column == "account_id":
        data["_outbound_external_id"] = f"{data['account_id']}:2025-03"
    with pytest.raises(MappingError, match="control character") as info:
        M.map_record(data)
    assert info.value.field == field and info.value.external_id == data["_outbound_external_id"]
    assert char not in str(info.value)


def test_schema_problems_name_missing_and_mistyped_columns():
    schema = {c: t for c, t in MonthEndArrMapper.required_columns().items()}
    assert MonthEndArrMapper.schema_problems(schema) == []
    schema["arr_amount"] = "FLOAT64"
    del schema["currency_code"]
    problems = MonthEndArrMapper.schema_problems(schema)
    assert "column arr_amount is FLOAT64, expected NUMERIC" in problems
    assert "required column currency_code is missing" in problems


def test_the_canonical_hash_is_sha256_of_the_sorted_compact_document():
    payload = {"Month_End_ARR_Key__c": "k1", "ARR_Amount__c": Decimal("10.50"), "Product_Line__c": None}
    document = {"object": "Month_End_ARR__c", "external_id_field": "Month_End_ARR_Key__c", "external_id": "k1",
                "payload": {"Month_End_ARR_Key__c": "k1", "ARR_Amount__c": "10.50", "Product_Line__c": None}}
    expected = hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert payload_hash("Month_End_ARR__c", "Month_End_ARR_Key__c", "k1", payload) == expected
    # A pinned value: changing canonicalization would silently rewrite every record.
    assert expected == payload_hash("Month_End_ARR__c", "Month_End_ARR_Key__c", "k1", dict(reversed(payload.items())))


# Pinned: a change here would make every scheduled run rewrite every record.
PINNED_MONTH_END_ARR_HASH = "5372e5a27567f0c43b846058d80cafd1d4370b644d2659cc097d3624a5379238"


def test_month_end_arr_hash_is_stable_across_runs():
    h = M.map_record(row()).payload_hash
    assert h == M.map_record(dict(reversed(list(row().items())))).payload_hash
    assert h == PINNED_MONTH_END_ARR_HASH


@given(st.dictionaries(st.from_regex(r"[A-Z][a-z]{0,6}__c", fullmatch=True),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20),
                                 st.decimals(allow_nan=False, allow_infinity=False, places=2)),
                       max_size=8))
def test_hash_ignores_key_order_and_is_deterministic(payload):
    reordered = dict(reversed(list(payload.items())))
    assert payload_hash("O", "K", "k", payload) == payload_hash("O", "K", "k", reordered)
    assert json.loads(canonical_json("O", "K", "k", payload))["payload"].keys() == payload.keys()


@given(st.text(max_size=8), st.text(max_size=8), st.text(max_size=12),
       st.dictionaries(st.text(max_size=8),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20),
                                 st.decimals(allow_nan=False, allow_infinity=False)),
                       max_size=8))
def test_the_mapping_threads_hash_is_the_canonical_hash_of_every_bounded_payload(target, field, external_id, payload):
    # The validation pass hashes with a prebuilt encoder; its bytes must be payload_hash's
    # (any difference would make every scheduled run rewrite every record).
    assert canonical_payload_hash(target, field, external_id, payload) == payload_hash(target, field, external_id,
                                                                                        payload)


@given(st.decimals(allow_nan=False, allow_infinity=False), st.integers(1, 18), st.integers(0, 6))
def test_a_decimal_is_emitted_at_its_scale_exactly_when_it_fits_the_declared_number(value, precision, scale):
    # The rule, stated independently: no non-zero digit past `scale` places and fewer than
    # precision - scale integer digits; emitted unchanged in value, at exactly `scale` places.
    scale = min(scale, precision)
    wide = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)
    fits = (value == value.quantize(Decimal(1).scaleb(-scale), context=wide)
            and abs(value) < Decimal(10) ** (precision - scale))
    try:
        emitted = exact_decimal(value, "N__c", precision=precision, scale=scale)
    except MappingError:
        assert not fits
        return
    assert fits and emitted == value and emitted.as_tuple().exponent == -scale
    spec = FieldContract("N__c", "currency", precision=precision, scale=scale)
    assert _number_problem(emitted, spec) is None


@pytest.mark.parametrize("text,ok", [("abcde", True), ("abcdef", False), ("é" * 5, True), ("a\tb", True),
                                     ("a\u2028b", True), ("a\x7fb", False), ("", False)])
def test_a_text_up_to_the_declared_length_without_control_characters_passes_and_any_other_is_refused(text, ok):
    assert (_text_problem(text, FieldContract("A__c", "string", length=5)) is None) is ok
