"""Month End ARR per account and month, written to the custom object Month_End_ARR__c."""

from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper

JOB_NAME = "month_end_arr"

__all__ = ["JOB_NAME", "MonthEndArrMapper"]
