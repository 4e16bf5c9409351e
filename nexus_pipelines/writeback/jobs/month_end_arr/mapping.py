"""Month End ARR mapper: the single source of truth for this job's write contract.

Source: one row per account and month (`sql/jobs/month_end_arr.sql`). Target:
`Month_End_ARR__c`, upserted by `Month_End_ARR_Key__c` ("<account id>:<YYYY-MM>").

Field ownership and null semantics:
- every field below is owned by the warehouse (finance marts), none is read back
  from NexusCRM;
- `Product_Line__c` is clearable: a null product line in the source clears it;
- every other field is required; a null there is a mapping error, never a clear.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, datetime
from decimal import Decimal
from typing import Any, ClassVar

from nexus_pipelines.integrations.nexuscrm import FieldContract
from nexus_pipelines.writeback.mapping import (
    EXTERNAL_ID_COLUMN,
    SOURCE_UPDATED_AT_COLUMN,
    Mapper,
    MappingError,
    exact_decimal,
    iso_date,
    require,
    utc_timestamp,
)

CURRENCIES = frozenset({"USD", "EUR", "GBP", "JPY", "CNY", "SGD", "AUD", "CAD"})
ARR_AMOUNT = FieldContract("ARR_Amount__c", "currency", precision=16, scale=2)


class MonthEndArrMapper(Mapper):
    TARGET_OBJECT: ClassVar[str] = "Month_End_ARR__c"
    # The write contract as deployed in NexusCRM: the preflight compares it with the
    # describe, and every emitted value is bounded by it.
    FIELDS: ClassVar[tuple[FieldContract, ...]] = (
        FieldContract("Month_End_ARR_Key__c", "string", length=40, nillable=False, external_id=True),
        FieldContract("Account_External_Id__c", "string", length=18),
        FieldContract("Month__c", "date"),
        ARR_AMOUNT,
        FieldContract("Currency_Code__c", "string", length=3),
        FieldContract("Product_Line__c", "string", length=80),
        FieldContract("Source_Updated_At__c", "datetime"),
    )
    CLEARABLE_FIELDS: ClassVar[frozenset[str]] = frozenset({"Product_Line__c"})
    SOURCE_COLUMNS: ClassVar[Mapping[str, str]] = {
        "account_id": "STRING",
        "month_start": "DATE",
        "arr_amount": "NUMERIC",
        "currency_code": "STRING",
        "product_line": "STRING",
    }

    def map_row(self, row: Mapping[str, Any]) -> dict[str, Any]:
        # Text lengths and characters are bounded by FIELDS when the payload is checked.
        key = require(row, EXTERNAL_ID_COLUMN, str)
        account = require(row, "account_id", str)
        month = require(row, "month_start", date)
        if isinstance(month, datetime):
            raise MappingError(None, "month_start", "expected DATE, got TIMESTAMP")
        if month.day != 1:
            raise MappingError(None, "month_start", "must be the first day of a month")
        month_text = iso_date(month, "Month__c")
        if key != f"{account}:{month_text[:7]}":  # YYYY-MM
            raise MappingError(None, EXTERNAL_ID_COLUMN, "does not match account_id and month_start")
        amount = exact_decimal(require(row, "arr_amount", (Decimal, int)), ARR_AMOUNT.name,
                               precision=ARR_AMOUNT.precision, scale=ARR_AMOUNT.scale)
        currency = require(row, "currency_code", str)
        if currency not in CURRENCIES:
            raise MappingError(None, "currency_code", "not a supported ISO 4217 currency code")
        product_line = require(row, "product_line", str, nullable=True)
        updated = require(row, SOURCE_UPDATED_AT_COLUMN, datetime)
        return {
            "Month_End_ARR_Key__c": key,
            "Account_External_Id__c": account,
            "Month__c": month_text,
            "ARR_Amount__c": amount,
            "Currency_Code__c": currency,
            "Product_Line__c": product_line,  # None clears it: the source owns clearing
            "Source_Updated_At__c": utc_timestamp(updated, "Source_Updated_At__c"),
        }
