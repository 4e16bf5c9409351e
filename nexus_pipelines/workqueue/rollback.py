"""Rollback of a WorkItem-owned generation to the Event path (docs/design/work-queue.md,
"Rollback to the Event path").

1. `disable_claims`: the generation goes to 'rolling_back': no claim selects it and no
   reclaim takes its expired leases (a claim or reclaim in flight holds the generation
   row, so the gate's lock waits for it). The time is recorded.
2. `fence`, in one transaction holding the generation row (so no claim or reclaim
   transaction is in flight), proves: no running item (no active or expired lease, so
   no started attempt), no drain still running that started before claims were
   disabled (`claimants.py`), and no item the Event path could not take over safely:
   a retry after a dispatched attempt, an attempt whose outcome was lost with its lease
   (ambiguous), or a replayed item (its history before the replay is not verifiable).
   Any of these refuses the fence with one line naming the first. Then every eligible
   item (pending, or a retry whose every attempt was handed back unstarted) becomes
   'awaiting_legacy_outcome' with the fence id, the owner-generation receipt binding the
   zero proof (counted in this transaction) and the fenced set (count and digest) is
   written (its id is the fence id), the generation becomes Event-owned and active, and
   the fenced items get their Event executions (same work ids): work an earlier
   cutover took from the Event path re-arms its 'transferred' execution under the new
   fence (it never reached an outcome), the rest get new ones. Only then may the Event
   path run them.

A rollback is abandoned with `generations.activate` (claims resume).
"""

from __future__ import annotations

from typing import Any

from psycopg import Connection

from nexus_pipelines.workqueue import claimants
from nexus_pipelines.workqueue.generations import (
    GenerationGateError,
    GenerationReceipt,
    lock_registration,
    write_receipt,
)
from nexus_pipelines.workqueue.states import (
    ACTIVE,
    AWAITING_LEGACY_OUTCOME,
    EVENT_PATH,
    PENDING,
    RETRY,
    ROLLING_BACK,
    RUNNING,
    TRANSFERRED,
    WORK_ITEM_PATH,
)


class RollbackRefused(GenerationGateError):
    """The rollback fence cannot be proven; nothing was fenced."""


# Items the fence may hand to the Event path: no attempt may have dispatched.
_ELIGIBLE = f"""
w.registration_id = %(reg)s AND w.revision = %(rev)s AND w.replays = 0 AND w.attempts = w.unstarted_attempts
AND w.state IN ('{PENDING}', '{RETRY}')
"""

# The first item of each kind that blocks the fence, with what to say about it.
_BLOCKERS = f"""
SELECT kind, work_id, detail FROM (
    (SELECT 1 AS rank, 'running' AS kind, work_id,
            format('held by %%s until %%s', lease_owner, to_char(lease_until, 'YYYY-MM-DD HH24:MI:SS')) AS detail
       FROM connector_work_items
      WHERE registration_id = %(reg)s AND revision = %(rev)s AND state = '{RUNNING}' AND lease_until > now()
      ORDER BY work_id LIMIT 1)
    UNION ALL
    (SELECT 2, 'expired', work_id, format('held by %%s, lease expired', lease_owner)
       FROM connector_work_items
      WHERE registration_id = %(reg)s AND revision = %(rev)s AND state = '{RUNNING}' AND lease_until <= now()
      ORDER BY work_id LIMIT 1)
    UNION ALL
    (SELECT 3, CASE WHEN replays > 0 THEN 'replayed'
                    WHEN failure_class = 'lease_expired' THEN 'ambiguous' ELSE 'dispatched' END, work_id,
            format('%%s of %%s attempts may have dispatched; last failure %%s', attempts - unstarted_attempts,
                   attempts, coalesce(failure_class, 'none'))
       FROM connector_work_items
      WHERE registration_id = %(reg)s AND revision = %(rev)s AND state IN ('{PENDING}', '{RETRY}')
        AND (replays > 0 OR attempts > unstarted_attempts)
      ORDER BY work_id LIMIT 1)
) blockers ORDER BY rank LIMIT 1
"""

# The zero proof, counted in the fence transaction (the blockers above refuse first, naming an
# item): running items and their active and expired leases, and unfinished items with an
# attempt that may have dispatched (started_attempts).
_MEASURED_FIELDS = ("running_items", "active_leases", "expired_leases", "started_attempts")
_MEASURE = f"""
SELECT count(*) FILTER (WHERE state = '{RUNNING}'),
       count(*) FILTER (WHERE state = '{RUNNING}' AND lease_until > now()),
       count(*) FILTER (WHERE state = '{RUNNING}' AND lease_until <= now()),
       count(*) FILTER (WHERE attempts > unstarted_attempts)
  FROM connector_work_items
 WHERE registration_id = %(reg)s AND revision = %(rev)s AND state IN ('{PENDING}', '{RETRY}', '{RUNNING}')
"""

_WHAT_TO_DO = {
    "running": "wait for it to finish, then run `queue rollback` again",
    "expired": "its holder may have dispatched it: resume claims (`queue activate`) so it is reclaimed and finished, "
               "then roll back again",
    "dispatched": "a retry after a dispatched attempt has an ambiguous external outcome: resume claims "
                  "(`queue activate`) until it is finished, then roll back again",
    "ambiguous": "its last attempt's outcome was lost with its lease: resume claims (`queue activate`) until it is "
                 "finished, then roll back again",
    "replayed": "its attempts before the replay are not verifiable: resume claims (`queue activate`) until it is "
                "finished, then roll back again",
}

_FENCE_SET = f"""
SELECT count(*), encode(sha256(convert_to(coalesce(string_agg(w.work_id::text, ',' ORDER BY w.work_id), ''), 'UTF8')),
                        'hex')
  FROM connector_work_items w WHERE {_ELIGIBLE}
"""

_FENCE_ITEMS = f"""
WITH fenced AS (
    SELECT w.work_id FROM connector_work_items w WHERE {_ELIGIBLE} ORDER BY w.work_id FOR UPDATE
)
UPDATE connector_work_items w
   SET state = '{AWAITING_LEGACY_OUTCOME}', rollback_fence_id = %(fence)s, updated_at = now()
  FROM fenced
 WHERE w.work_id = fenced.work_id
"""

# The fenced items (the fence's own set, after _FENCE_ITEMS).
_FENCED = f"""
w.registration_id = %(reg)s AND w.revision = %(rev)s AND w.rollback_fence_id = %(fence)s
AND w.state = '{AWAITING_LEGACY_OUTCOME}'
"""

# Work an earlier cutover took from the Event path has a 'transferred' execution with
# the same work id (it never reached an outcome): it is re-armed under this fence.
_REARM = f"""
UPDATE event_executions x
   SET state = '{PENDING}', rollback_fence_id = %(fence)s, attempts = 0, run_after = now(), start_token = NULL,
       started_at = NULL, finished_at = NULL, outcome = NULL, failure_class = NULL, failure_summary = NULL,
       updated_at = now()
  FROM connector_work_items w
 WHERE x.work_id = w.work_id AND x.state = '{TRANSFERRED}' AND {_FENCED}
"""

# Every other fenced item gets its execution (an execution of the same work id in any
# other state is a unique violation: the hand-over fails closed). The re-armed set is
# read once, before the insert: a per-row probe of the table being filled re-reads every
# row inserted so far (quadratic: 110 s instead of 3 s for 100,000 items).
_HAND_OVER = f"""
WITH armed AS MATERIALIZED (
    SELECT work_id FROM event_executions
     WHERE registration_id = %(reg)s AND revision = %(rev)s AND rollback_fence_id = %(fence)s
)
INSERT INTO event_executions (work_id, event_id, work_type, registration_id, revision, queue_class, source_lane_key,
                              target_lane_key, max_attempts, rollback_fence_id)
SELECT work_id, event_id, work_type, registration_id, revision, queue_class, source_lane_key, target_lane_key,
       max_attempts, rollback_fence_id
  FROM connector_work_items w
 WHERE {_FENCED}
   AND w.work_id NOT IN (SELECT work_id FROM armed)
 ORDER BY work_id
"""


def disable_claims(conn: Connection, registration_id: str, revision: int, *, recorded_by: str) -> bool:
    """Stop WorkItem claims and reclaims of an active generation; False when already stopped."""
    with conn.transaction():
        current = lock_registration(conn, registration_id).get(revision)
        name = f"{registration_id}@{revision}"
        if current is None or current.claim_path != WORK_ITEM_PATH:
            owner = "never activated" if current is None else "Event-owned already"
            raise RollbackRefused(f"generation {name} is {owner}; only an active WorkItem generation rolls back")
        if current.status == ROLLING_BACK:
            return False
        if current.status != ACTIVE:
            raise RollbackRefused(f"generation {name} is {current.status!r}; only an active generation rolls back")
        conn.execute(
            f"""UPDATE workqueue_generations
                  SET status = '{ROLLING_BACK}', claims_disabled_at = clock_timestamp(), updated_at = clock_timestamp()
                WHERE registration_id = %s AND revision = %s""",
            (registration_id, revision),
        )
        write_receipt(conn, registration_id, revision, "claims_disabled", recorded_by, {"previous_status": ACTIVE})
        return True


def fence(conn: Connection, registration_id: str, revision: int, *, recorded_by: str) -> GenerationReceipt:
    """Fence every eligible item and hand the generation to the Event path; raises RollbackRefused."""
    params: dict[str, Any] = {"reg": registration_id, "rev": revision}
    name = f"{registration_id}@{revision}"
    with conn.transaction():
        current = lock_registration(conn, registration_id).get(revision)
        if current is None or current.status != ROLLING_BACK:
            raise RollbackRefused(f"generation {name} is not rolling back; run `queue rollback` to stop its claims")
        (disabled_at,) = conn.execute(
            "SELECT claims_disabled_at FROM workqueue_generations WHERE registration_id = %s AND revision = %s",
            (registration_id, revision),
        ).fetchone()
        _refuse_blockers(conn, params, name)
        drains = claimants.running_since_before(conn, registration_id, disabled_at)
        if drains:
            first = drains[0]
            raise RollbackRefused(
                f"generation {name}: {len(drains)} drains that started before its claims were disabled are still "
                f"running (first: {first.claimant_id}, registered until {first.expires_at:%Y-%m-%d %H:%M:%S} UTC); "
                "wait for them to stop, then run `queue rollback` again"
            )
        measured = dict(zip(_MEASURED_FIELDS, conn.execute(_MEASURE, params).fetchone()))
        measured["claim_capable_drains"] = len(drains)
        if any(measured.values()):
            counts = ", ".join(f"{k}={v}" for k, v in measured.items() if v)
            raise RollbackRefused(f"generation {name}: the fence measured {counts}; nothing was fenced: run "
                                  "`queue rollback` again to see the item that blocks it")
        fenced_items, set_digest = conn.execute(_FENCE_SET, params).fetchone()
        proof = {
            **measured,
            # no claim or reclaim transaction is in flight: each holds the generation row FOR KEY SHARE,
            # which the FOR UPDATE taken above waited for
            "claim_transactions": 0,
            "claims_disabled_at": disabled_at.isoformat(),
            "fenced_items": fenced_items, "fenced_set_digest": set_digest,
        }
        receipt = write_receipt(conn, registration_id, revision, "rollback_fence", recorded_by, proof)
        params["fence"] = receipt.receipt_id
        if conn.execute(_FENCE_ITEMS, params).rowcount != fenced_items:
            raise RollbackRefused(f"generation {name}: the fenced set changed under the fence; nothing was fenced")
        conn.execute(
            f"""UPDATE workqueue_generations
                  SET claim_path = '{EVENT_PATH}', status = '{ACTIVE}', claims_disabled_at = NULL,
                      activation_receipt_id = %(fence)s, updated_at = clock_timestamp()
                WHERE registration_id = %(reg)s AND revision = %(rev)s""",
            params,
        )
        conn.execute(_REARM, params)
        conn.execute(_HAND_OVER, params)
        return receipt


def _refuse_blockers(conn: Connection, params: dict[str, Any], name: str) -> None:
    row = conn.execute(_BLOCKERS, params).fetchone()
    if row is None:
        return
    kind, work_id, detail = row
    raise RollbackRefused(f"generation {name}: work item {work_id} blocks the rollback ({kind}: {detail}); "
                          f"{_WHAT_TO_DO[kind]}")
