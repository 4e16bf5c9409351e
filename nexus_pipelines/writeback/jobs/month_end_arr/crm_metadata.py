"""The target object's metadata as deployed in NexusCRM, for the local simulator, the
demo and the tests (the CRM-side precondition of seed 004 section 9: the external ID
field is unique and an idLookup field)."""

from __future__ import annotations

from typing import Any

from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper


def field_specs() -> list[Any]:
    from nexus_pipelines.local.simulators.nexuscrm import FieldSpec

    m = MonthEndArrMapper
    return [
        FieldSpec(m.EXTERNAL_ID_FIELD, type="string", external_id=True, unique=True, nillable=False, length=m.KEY_LENGTH),
        FieldSpec("Account_External_Id__c", type="string", length=m.ACCOUNT_LENGTH),
        FieldSpec("Month__c", type="date"),
        FieldSpec("ARR_Amount__c", type="currency", precision=16, scale=2),
        FieldSpec("Currency_Code__c", type="string", length=3),
        FieldSpec("Product_Line__c", type="string", length=m.PRODUCT_LINE_LENGTH),
        FieldSpec("Source_Updated_At__c", type="datetime"),
        FieldSpec("Owner_Notes__c", type="string", length=255),  # owned by CRM users, never written
    ]


def define_object(state: Any) -> None:
    """Deploy Month_End_ARR__c into a simulator state."""
    state.define_object(MonthEndArrMapper.TARGET_OBJECT, field_specs(), key_prefix="a0M")


def reject_negative_arr(record: dict) -> str | None:
    """A CRM validation rule used by the demo: negative ARR is rejected per record."""
    amount = record.get("ARR_Amount__c")
    if amount is not None and str(amount).startswith("-"):
        return "ARR_Amount__c must not be negative"
    return None
