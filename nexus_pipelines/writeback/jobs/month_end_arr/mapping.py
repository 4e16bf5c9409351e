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

from nexus_pipelines.writeback.mapping import (
    EXTERNAL_ID_COLUMN,
    SOURCE_UPDATED_AT_COLUMN,
    Mapper,
    MappingError,
    bounded_text,
    exact_decimal,
    iso_date,
    require,
    utc_timestamp,
)

ARR_PRECISION = 16
ARR_SCALE = 2
CURRENCIES = frozenset({"USD", "EUR", "GBP", "JPY", "CNY", "SGD", "AUD", "CAD"})


class MonthEndArrMapper(Mapper):
    TARGET_OBJECT: ClassVar[str] = "Month_End_ARR__c"
    EXTERNAL_ID_FIELD: ClassVar[str] = "Month_End_ARR_Key__c"
    OWNED_FIELDS: ClassVar[frozenset[str]] = frozenset(
        {
            "Month_End_ARR_Key__c",
            "Account_External_Id__c",
            "Month__c",
            "ARR_Amount__c",
            "Currency_Code__c",
            "Product_Line__c",
            "Source_Updated_At__c",
        }
    )
    CLEARABLE_FIELDS: ClassVar[frozenset[str]] = frozenset({"Product_Line__c"})
    SOURCE_COLUMNS: ClassVar[Mapping[str, str]] = {
        "account_id": "STRING",
        "month_start": "DATE",
        "arr_amount": "NUMERIC",
        "currency_code": "STRING",
        "product_line": "STRING",
    }
    # Target field lengths, checked again by the CRM preflight/describe in tests.
    KEY_LENGTH: ClassVar[int] = 40
    ACCOUNT_LENGTH: ClassVar[int] = 18
    PRODUCT_LINE_LENGTH: ClassVar[int] = 80

    def map_row(self, row: Mapping[str, Any]) -> dict[str, Any]:
        key = bounded_text(require(row, EXTERNAL_ID_COLUMN, str), self.EXTERNAL_ID_FIELD, max_length=self.KEY_LENGTH)
        account = bounded_text(require(row, "account_id", str), "Account_External_Id__c", max_length=self.ACCOUNT_LENGTH)
        month = require(row, "month_start", date)
        if isinstance(month, datetime):
            raise MappingError(None, "month_start", "expected DATE, got TIMESTAMP")
        if month.day != 1:
            raise MappingError(None, "month_start", "must be the first day of a month")
        if key != f"{account}:{month:%Y-%m}":
            raise MappingError(None, EXTERNAL_ID_COLUMN, "does not match account_id and month_start")
        amount = exact_decimal(require(row, "arr_amount", (Decimal, int)), "ARR_Amount__c",
                               precision=ARR_PRECISION, scale=ARR_SCALE)
        currency = require(row, "currency_code", str)
        if currency not in CURRENCIES:
            raise MappingError(None, "currency_code", "not a supported ISO 4217 currency code")
        product_line = require(row, "product_line", str, nullable=True)
        if product_line is not None:
            product_line = bounded_text(product_line, "Product_Line__c", max_length=self.PRODUCT_LINE_LENGTH)
        updated = require(row, SOURCE_UPDATED_AT_COLUMN, datetime)
        return {
            "Month_End_ARR_Key__c": key,
            "Account_External_Id__c": account,
            "Month__c": iso_date(month, "Month__c"),
            "ARR_Amount__c": amount,
            "Currency_Code__c": currency,
            "Product_Line__c": product_line,  # None clears it: the source owns clearing
            "Source_Updated_At__c": utc_timestamp(updated, "Source_Updated_At__c"),
        }
