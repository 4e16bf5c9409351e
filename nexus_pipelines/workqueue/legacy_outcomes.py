"""LegacyOutcomeReceipts and their projection onto rollback-fenced work items
(docs/design/work-queue.md, "Reconciliation and re-cutover").

The Event path writes a versioned receipt in the same transaction as an execution's
terminal outcome (the database refuses the outcome without it). A receipt is
immutable; its digest binds the work, the version, the outcome, the fence and the
attempt's token. Version 1 is the Event path's own outcome; an operator confirming an
'unknown' outcome writes the next version.

The projector moves each work item awaiting its legacy outcome to
'reconciled_legacy_terminal' with the version and digest of the latest receipt of its
work, when that receipt is terminal (succeeded or failed). It runs after the Event
path's executions and before a cutover, so a crash between a receipt's commit and its
projection is repaired from the receipt. Projecting twice, or delivering the same
terminal outcome twice, changes nothing. An 'unknown' outcome keeps the item awaiting
(non-executable) and blocks a cutover until it is confirmed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from psycopg import Connection
from psycopg.types.json import Jsonb

from nexus_pipelines.workqueue.states import (
    AWAITING_LEGACY_OUTCOME,
    CONFIRMED_OUTCOMES,
    LEGACY_OUTCOMES,
    RECONCILED_LEGACY_TERMINAL,
    UNKNOWN,
    sql_in,
)


class ConflictingOutcome(RuntimeError):
    """A second terminal outcome disagrees with the confirmed one; nothing was written."""


@dataclass(frozen=True)
class LegacyOutcomeReceipt:
    receipt_id: int
    work_id: int
    version: int
    outcome: str
    rollback_fence_id: int | None
    execution_token: int | None
    digest: str


@dataclass(frozen=True)
class Execution:
    """The identity of one Event-path execution, as a receipt records it."""

    work_id: int
    event_id: int
    work_type: str
    registration_id: str
    revision: int
    rollback_fence_id: int | None


def digest(execution: Execution, version: int, outcome: str, token: int | None, detail: dict[str, Any]) -> str:
    canonical = json.dumps(
        {
            "work_id": execution.work_id, "event_id": execution.event_id, "work_type": execution.work_type,
            "generation": [execution.registration_id, execution.revision], "version": version, "outcome": outcome,
            "rollback_fence_id": execution.rollback_fence_id, "execution_token": token, "detail": detail,
        },
        sort_keys=True, separators=(",", ":"),
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


_COLUMNS = "receipt_id, work_id, version, outcome, rollback_fence_id, execution_token, digest"


def latest(conn: Connection, work_id: int) -> LegacyOutcomeReceipt | None:
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM legacy_outcome_receipts WHERE work_id = %s ORDER BY version DESC LIMIT 1", (work_id,)
    ).fetchone()
    return LegacyOutcomeReceipt(*row) if row else None


def record(
    conn: Connection,
    execution: Execution,
    outcome: str,
    *,
    token: int | None,
    detail: dict[str, Any],
    recorded_by: str,
) -> LegacyOutcomeReceipt:
    """Write the next receipt version for `execution`'s outcome, in the caller's transaction.

    The caller holds the execution's row lock. Delivering the latest outcome again
    returns the existing receipt (nothing changes); a different outcome after a
    confirmed one raises ConflictingOutcome.
    """
    if outcome not in LEGACY_OUTCOMES:
        raise ValueError(f"legacy outcome {outcome!r} is not one of {LEGACY_OUTCOMES}")
    previous = latest(conn, execution.work_id)
    if previous is not None and previous.outcome == outcome and previous.execution_token == token:
        return previous  # a duplicate terminal delivery
    if previous is not None and previous.outcome in CONFIRMED_OUTCOMES:
        raise ConflictingOutcome(
            f"work {execution.work_id} already has the confirmed legacy outcome {previous.outcome!r} "
            f"(receipt version {previous.version}); refusing {outcome!r}"
        )
    version = previous.version + 1 if previous else 1
    value = digest(execution, version, outcome, token, detail)
    row = conn.execute(
        f"""INSERT INTO legacy_outcome_receipts (work_id, event_id, work_type, registration_id, revision, version,
                                                 outcome, rollback_fence_id, execution_token, detail, digest,
                                                 recorded_by)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING {_COLUMNS}""",
        (execution.work_id, execution.event_id, execution.work_type, execution.registration_id, execution.revision,
         version, outcome, execution.rollback_fence_id, token, Jsonb(detail), value, recorded_by),
    ).fetchone()
    return LegacyOutcomeReceipt(*row)


# The latest receipt of each awaiting item's work, when terminal; rows are locked in
# work_id order and skipped when another projector holds them (it projects them).
_PROJECT = f"""
WITH due AS (
    SELECT w.work_id, r.version, r.digest, r.outcome
      FROM connector_work_items w
      JOIN LATERAL (SELECT version, digest, outcome, rollback_fence_id FROM legacy_outcome_receipts l
                     WHERE l.work_id = w.work_id ORDER BY version DESC LIMIT 1) r
        ON r.rollback_fence_id = w.rollback_fence_id
     WHERE w.state = '{AWAITING_LEGACY_OUTCOME}' AND w.rollback_fence_id IS NOT NULL
       AND w.registration_id = %(reg)s AND w.revision = %(rev)s
       AND r.outcome IN {sql_in(CONFIRMED_OUTCOMES)}
     ORDER BY w.work_id
     LIMIT %(limit)s
       FOR NO KEY UPDATE OF w SKIP LOCKED
)
UPDATE connector_work_items w
   SET state = '{RECONCILED_LEGACY_TERMINAL}',
       legacy_outcome_receipt_version = due.version,
       legacy_outcome_digest = due.digest,
       outcome = 'legacy:' || due.outcome,
       finished_at = now(),
       updated_at = now()
  FROM due
 WHERE w.work_id = due.work_id
RETURNING w.work_id
"""


def project(conn: Connection, registration_id: str, revision: int, *, batch: int = 5000) -> int:
    """Reconcile every awaiting item of the generation whose latest receipt is terminal; returns how many."""
    total = 0
    while True:
        done = conn.execute(_PROJECT, {"reg": registration_id, "rev": revision, "limit": batch}).rowcount
        total += done
        if done < batch:
            return total


@dataclass(frozen=True)
class FenceState:
    """What a generation's rollback fences still wait for."""

    awaiting: int  # fenced items without a terminal receipt yet
    unknown: int  # of those, the ones whose latest receipt says 'unknown' (quarantined)
    reconciled: int
    first_awaiting: int | None
    first_unknown: int | None


def fence_state(conn: Connection, registration_id: str, revision: int) -> FenceState:
    row = conn.execute(
        f"""SELECT count(*) FILTER (WHERE w.state = '{AWAITING_LEGACY_OUTCOME}'),
                   count(*) FILTER (WHERE w.state = '{AWAITING_LEGACY_OUTCOME}' AND r.outcome = '{UNKNOWN}'),
                   count(*) FILTER (WHERE w.state = '{RECONCILED_LEGACY_TERMINAL}'),
                   min(w.work_id) FILTER (WHERE w.state = '{AWAITING_LEGACY_OUTCOME}'),
                   min(w.work_id) FILTER (WHERE w.state = '{AWAITING_LEGACY_OUTCOME}' AND r.outcome = '{UNKNOWN}')
              FROM connector_work_items w
              LEFT JOIN LATERAL (SELECT outcome FROM legacy_outcome_receipts l WHERE l.work_id = w.work_id
                                  ORDER BY version DESC LIMIT 1) r ON true
             WHERE w.registration_id = %s AND w.revision = %s AND w.rollback_fence_id IS NOT NULL""",
        (registration_id, revision),
    ).fetchone()
    return FenceState(*row)


@dataclass(frozen=True)
class FenceSummary:
    fence_id: int
    registration_id: str
    revision: int
    recorded_at: Any
    fenced_items: int
    awaiting: int
    unknown: int
    reconciled: int
    claim_path: str
    status: str


_FENCES = f"""
SELECT f.receipt_id, f.registration_id, f.revision, f.recorded_at, (f.proof ->> 'fenced_items')::int,
       count(w.work_id) FILTER (WHERE w.state = '{AWAITING_LEGACY_OUTCOME}'),
       count(w.work_id) FILTER (WHERE w.state = '{AWAITING_LEGACY_OUTCOME}' AND r.outcome = '{UNKNOWN}'),
       count(w.work_id) FILTER (WHERE w.state = '{RECONCILED_LEGACY_TERMINAL}'),
       g.claim_path, g.status
  FROM workqueue_generation_receipts f
  JOIN workqueue_generations g ON g.registration_id = f.registration_id AND g.revision = f.revision
  LEFT JOIN connector_work_items w ON w.rollback_fence_id = f.receipt_id
  LEFT JOIN LATERAL (SELECT outcome FROM legacy_outcome_receipts l WHERE l.work_id = w.work_id
                      ORDER BY version DESC LIMIT 1) r ON true
 WHERE f.kind = 'rollback_fence' {{reg_filter}}
 GROUP BY f.receipt_id, g.claim_path, g.status
 ORDER BY f.receipt_id DESC
 LIMIT %(limit)s
"""


def fences(conn: Connection, *, registration_id: str | None = None, limit: int = 50) -> list[FenceSummary]:
    """The newest rollback fences with what their items still wait for."""
    sql = _FENCES.format(reg_filter="AND f.registration_id = %(reg)s" if registration_id else "")
    return [FenceSummary(*r) for r in conn.execute(sql, {"reg": registration_id, "limit": limit}).fetchall()]
