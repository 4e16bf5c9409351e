"""Every state list of the work queue, in one place.

The SQL of this package is written with these names (`sql_in`), and the CHECK
constraints of the migrations list the same values: `tests/workqueue/test_states.py`
compares each list with the constraint the database enforces, so a state added here
and not in a migration (or the other way round) fails the suite.
"""

from __future__ import annotations

from collections.abc import Iterable

# --- work items (the WorkItem claim path) ------------------------------------------------
PENDING = "pending"
RUNNING = "running"
RETRY = "retry"
COMPLETED = "completed"
DEAD = "dead"
# rollback fencing and reconciliation (docs/design/work-queue.md): handed to the Event path, then reconciled from
# its LegacyOutcomeReceipt; a reconciled row is immutable
AWAITING_LEGACY_OUTCOME = "awaiting_legacy_outcome"
RECONCILED_LEGACY_TERMINAL = "reconciled_legacy_terminal"

WORK_ITEM_STATES = (PENDING, RUNNING, RETRY, COMPLETED, DEAD, AWAITING_LEGACY_OUTCOME, RECONCILED_LEGACY_TERMINAL)
CLAIMABLE = (PENDING, RETRY)
UNFINISHED = (PENDING, RETRY, RUNNING)

# --- event executions (the Event claim path) ---------------------------------------------
STARTED = "started"
SUCCEEDED = "succeeded"
FAILED = "failed"
UNKNOWN = "unknown"  # the attempt's external outcome cannot be known: quarantined until confirmed
TRANSFERRED = "transferred"  # handed to a work item by a cutover; the Event path never runs it

EXECUTION_STATES = (PENDING, STARTED, RETRY, SUCCEEDED, FAILED, UNKNOWN, TRANSFERRED)
EXECUTABLE = (PENDING, RETRY)
EXECUTION_UNFINISHED = (PENDING, STARTED, RETRY)
LEGACY_OUTCOMES = (SUCCEEDED, FAILED, UNKNOWN)
CONFIRMED_OUTCOMES = (SUCCEEDED, FAILED)

# --- generations -------------------------------------------------------------------------
WORK_ITEM_PATH = "work_item"
EVENT_PATH = "event"
CLAIM_PATHS = (WORK_ITEM_PATH, EVENT_PATH)

ACTIVE = "active"
QUIESCING = "quiescing"
QUIESCED = "quiesced"
ROLLING_BACK = "rolling_back"  # WorkItem claims and reclaims disabled until the rollback fence
GENERATION_STATUSES = (ACTIVE, QUIESCING, QUIESCED, ROLLING_BACK)

RECEIPT_KINDS = ("activation", "quiesce", "drained", "claims_disabled", "rollback_fence", "event_activation")


def sql_in(values: Iterable[str]) -> str:
    """`('a', 'b')` for an SQL `IN` list (the values are this module's constants, never input)."""
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"
