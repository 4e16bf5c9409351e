"""Checking a batch's positional results against what the ledger already knows (issue 12
item 4): what counts as a contradiction, and what a CRM-side deletion looks like."""

from __future__ import annotations

import pytest

from nexus_pipelines.integrations.nexuscrm import RecordWriteResult
from nexus_pipelines.writeback.batch import contradiction
from nexus_pipelines.writeback.ledger import RecordState
from nexus_pipelines.writeback.mapping import MappedRecord


def pending(external_id: str, crm_id: str | None):
    prior = None if crm_id is None else RecordState(external_id, "h0", "succeeded", 1, None, crm_id, None)
    return MappedRecord(external_id, None, {}, "h1"), prior


def ok(external_id: str, crm_id: str, created: bool) -> RecordWriteResult:
    return RecordWriteResult(external_id, True, crm_id, None, None, False, created)


BATCH = [pending("A", "a0M1"), pending("B", "a0M2"), pending("C", None)]


@pytest.mark.parametrize("results,why", [
    ((ok("A", "a0M2", False), ok("B", "a0M1", False), ok("C", "a0M3", True)),
     "A got id a0M2, which the ledger holds for B"),
    ((ok("A", "a0M1", False), ok("B", "a0M9", False), ok("C", "a0M3", True)),
     "B was updated as a0M9, the ledger holds a0M2"),
    ((ok("A", "a0M1", True), ok("B", "a0M2", False), ok("C", "a0M3", True)),
     "A was created as a0M1, a record the ledger already holds"),
    ((ok("A", "a0M1", False), ok("B", "a0M2", False), ok("C", "a0M1", True)),
     "id a0M1 was answered for both A and C"),
])
def test_results_that_contradict_the_ledger_are_named(results, why):
    assert contradiction(BATCH, results) == why


def test_consistent_results_and_a_record_recreated_after_a_crm_deletion_are_accepted():
    plain = (ok("A", "a0M1", False), ok("B", "a0M2", False), ok("C", "a0M3", True))
    assert contradiction(BATCH, plain) is None
    # B was deleted in the CRM and the upsert created it anew: a new id, "created".
    recreated = (ok("A", "a0M1", False), ok("B", "a0M8", True), ok("C", "a0M3", True))
    assert contradiction(BATCH, recreated) is None
    failed = RecordWriteResult("B", False, None, "UNABLE_TO_LOCK_ROW", "locked", True)
    assert contradiction(BATCH, (plain[0], failed, plain[2])) is None
