"""Generation gates: activation receipts, quiesce and drain proofs, and the cutover from
the Event path to the WorkItem path (docs/design/work-queue.md, "Quiesce and the drain
proof" and "Reconciliation and re-cutover").

A generation (registration, revision) is owned by one claim path (`claim_path`):
its work items are claimable only while it is WorkItem-owned and 'active', its Event
executions start only while it is Event-owned and 'active', and the database refuses
any state in which the path that does not own it has something to run (0017). A
generation becomes 'active' only together with a durable, immutable receipt in
`workqueue_generation_receipts` (which binds the route versions replay checks). One
generation per registration may be active.

Claims (on the generations they take items from) and Event starts take `FOR KEY SHARE`
on the generation row; every gate takes `FOR UPDATE`, so once a gate commits no claim
admitted before it is still in flight.

Cutover of an Event-owned generation to WorkItem claims (`activate` with the WorkItem
path): its Event admission must be stopped (`quiesce`), its scheduler lease gone and no
execution started (the drain proof); every item a rollback fenced must be reconciled
from its terminal LegacyOutcomeReceipt, every fence's set must be complete, and no
outcome may be unknown (reconciliation; the projector runs first, repairing a crash between a
receipt and its projection). Then, in the same transaction, the Event path's
unfinished work becomes work items with the same work ids (new events that have no
work item row; a reconciled row is never reopened), and only then is the activation
receipt written.

Ambiguous ownership fails closed: activation is refused while another revision of the
registration is active, quiescing without a drain proof, or rolling back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psycopg import Connection
from psycopg.types.json import Jsonb

from nexus_pipelines.workqueue import event_path, legacy_outcomes
from nexus_pipelines.workqueue.states import (
    ACTIVE,
    CLAIM_PATHS,
    EVENT_PATH,
    EXECUTABLE,
    PENDING,
    QUIESCED,
    QUIESCING,
    RETRY,
    ROLLING_BACK,
    RUNNING,
    TRANSFERRED,
    UNFINISHED,
    WORK_ITEM_PATH,
    sql_in,
)

CLAIM_SCHEMA = "0018_workqueue_rearm_and_no_truncate"


class GenerationGateError(RuntimeError):
    """A generation gate cannot be proven; nothing was changed."""


@dataclass(frozen=True)
class DrainStatus:
    registration_id: str
    revision: int
    status: str | None
    active_leases: int  # WorkItem path: unexpired item leases; Event path: the live scheduler lease (0 or 1)
    expired_leases: int  # WorkItem path: expired item leases; Event path: executions left started by a gone holder
    claim_path: str = WORK_ITEM_PATH
    in_flight: int = 0  # Event path: executions recorded as started

    @property
    def drained(self) -> bool:
        return self.active_leases == 0 and self.expired_leases == 0 and self.in_flight == 0


@dataclass(frozen=True)
class GenerationReceipt:
    receipt_id: int
    registration_id: str
    revision: int
    kind: str
    proof: dict[str, Any]


@dataclass(frozen=True)
class Generation:
    revision: int
    status: str
    claim_path: str
    activation_receipt_id: int | None


def lock_registration(conn: Connection, registration_id: str) -> dict[int, Generation]:
    """Serialize with every gate change of the registration; its generations by revision, locked."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('workqueue-generation:' || %s, 0))", (registration_id,))
    rows = conn.execute(
        """SELECT revision, status, claim_path, activation_receipt_id FROM workqueue_generations
            WHERE registration_id = %s FOR UPDATE""",
        (registration_id,),
    ).fetchall()
    return {r[0]: Generation(*r) for r in rows}


def write_receipt(
    conn: Connection, registration_id: str, revision: int, kind: str, recorded_by: str, proof: dict[str, Any]
) -> GenerationReceipt:
    (receipt_id,) = conn.execute(
        """INSERT INTO workqueue_generation_receipts (registration_id, revision, kind, recorded_by, proof)
           VALUES (%s, %s, %s, %s, %s) RETURNING receipt_id""",
        (registration_id, revision, kind, recorded_by, Jsonb(proof)),
    ).fetchone()
    return GenerationReceipt(receipt_id, registration_id, revision, kind, proof)


def _receipt(conn: Connection, receipt_id: int, registration_id: str, revision: int) -> GenerationReceipt:
    kind, proof = conn.execute(
        "SELECT kind, proof FROM workqueue_generation_receipts WHERE receipt_id = %s", (receipt_id,)
    ).fetchone()
    return GenerationReceipt(receipt_id, registration_id, revision, kind, proof)


def _lease_counts(conn: Connection, registration_id: str, revision: int) -> tuple[int, int]:
    active, expired = conn.execute(
        f"""SELECT count(*) FILTER (WHERE lease_until > now()), count(*) FILTER (WHERE lease_until <= now())
             FROM connector_work_items
            WHERE state = '{RUNNING}' AND lease_owner IS NOT NULL AND lease_until IS NOT NULL
              AND registration_id = %s AND revision = %s""",
        (registration_id, revision),
    ).fetchone()
    return active, expired


def bound_route_versions(conn: Connection, registration_id: str, revision: int) -> dict[str, int]:
    row = conn.execute(
        "SELECT route_versions FROM workqueue_generations WHERE registration_id = %s AND revision = %s",
        (registration_id, revision),
    ).fetchone()
    return dict(row[0]) if row else {}


def activate(
    conn: Connection,
    registration_id: str,
    revision: int,
    *,
    recorded_by: str,
    route_versions: Mapping[str, int],
    proof: Mapping[str, Any] | None = None,
    claim_path: str = WORK_ITEM_PATH,
) -> GenerationReceipt:
    """Write the durable activation receipt and make the generation claimable on `claim_path`.

    Idempotent for a generation already active on that path (returns its receipt).
    Activating a rolling-back generation on the WorkItem path resumes its claims; an
    Event-owned one is cut over (see the module docstring). Raises
    GenerationGateError when ownership is ambiguous or a gate cannot be proven.
    """
    if claim_path not in CLAIM_PATHS:
        raise GenerationGateError(f"claim path {claim_path!r} is not one of {CLAIM_PATHS}")
    with conn.transaction():
        generations = lock_registration(conn, registration_id)
        current = generations.get(revision)
        if current is not None and current.status == ACTIVE and current.claim_path == claim_path:
            return _receipt(conn, current.activation_receipt_id, registration_id, revision)
        evidence = {"other_revisions": _prove_others_drained(conn, registration_id, revision, generations)}
        evidence.update(_prove_this_generation(conn, registration_id, revision, current, claim_path))
        receipt_proof = {
            **dict(proof or {}),  # the caller's extra evidence never replaces the verified gate proof
            "claim_schema": CLAIM_SCHEMA,
            "claim_path": claim_path,
            "route_versions": {k: int(v) for k, v in route_versions.items()},
            **evidence,
        }
        kind = "event_activation" if claim_path == EVENT_PATH else "activation"
        receipt = write_receipt(conn, registration_id, revision, kind, recorded_by, receipt_proof)
        cutover = receipt_proof.get("cutover")
        if cutover is not None:
            _transfer_unfinished(conn, registration_id, revision)  # before the owner changes: the database checks
        _set_active(conn, registration_id, revision, claim_path, receipt.receipt_id, receipt_proof["route_versions"])
        if cutover is not None:
            made = _materialize_transferred(conn, registration_id, revision)
            if made != cutover["materialized_work_items"]:
                raise GenerationGateError(
                    f"generation {registration_id}@{revision}: the cutover bound {cutover['materialized_work_items']} "
                    f"new work items but created {made}; nothing was changed"
                )
        return receipt


def _set_active(conn: Connection, registration_id: str, revision: int, claim_path: str, receipt_id: int,
                route_versions: dict[str, int]) -> None:
    conn.execute(
        f"""INSERT INTO workqueue_generations (registration_id, revision, status, claim_path, activation_receipt_id,
                                              route_versions)
           VALUES (%(reg)s, %(rev)s, '{ACTIVE}', %(path)s, %(receipt)s, %(routes)s)
           ON CONFLICT (registration_id, revision) DO UPDATE
              SET status = '{ACTIVE}', claim_path = EXCLUDED.claim_path, claims_disabled_at = NULL,
                  activation_receipt_id = EXCLUDED.activation_receipt_id, route_versions = EXCLUDED.route_versions,
                  updated_at = clock_timestamp()""",
        {"reg": registration_id, "rev": revision, "path": claim_path, "receipt": receipt_id,
         "routes": Jsonb(route_versions)},
    )


def _prove_others_drained(
    conn: Connection, registration_id: str, revision: int, generations: Mapping[int, Generation]
) -> dict[str, Any]:
    others: dict[str, Any] = {}
    for other, gen in sorted(generations.items()):
        if other == revision:
            continue
        if gen.status == ACTIVE:
            raise GenerationGateError(
                f"revision {other} of {registration_id} is still active ({gen.claim_path} path); quiesce it and "
                f"record its drain proof before activating revision {revision}"
            )
        if gen.status in (QUIESCING, ROLLING_BACK):
            raise GenerationGateError(
                f"revision {other} of {registration_id} is {gen.status!r} without a drain proof; run "
                f"`queue quiesce {registration_id} {other}` until it reports drained"
            )
        status = drain_status(conn, registration_id, other)
        if not status.drained:
            raise GenerationGateError(
                f"revision {other} of {registration_id} still holds {status.active_leases + status.expired_leases} "
                f"leases and {status.in_flight} started executions"
            )
        others[str(other)] = {"status": gen.status, "claim_path": gen.claim_path, "leases": 0}
    return others


def _prove_this_generation(
    conn: Connection, registration_id: str, revision: int, current: Generation | None, claim_path: str
) -> dict[str, Any]:
    name = f"{registration_id}@{revision}"
    if current is None:
        if claim_path == EVENT_PATH:
            _refuse_claimable_work_items(conn, registration_id, revision)
        return {}
    if current.claim_path == claim_path:
        if current.status == ROLLING_BACK:
            return {"resumed_from": ROLLING_BACK}  # the rollback is abandoned: claims resume
        return {"reactivated_from": current.status}
    if current.status == ACTIVE:
        raise GenerationGateError(f"generation {name} is active on the {current.claim_path} path; "
                                  f"{'roll it back' if claim_path == EVENT_PATH else 'quiesce its Event path'} first")
    if claim_path == EVENT_PATH:
        raise GenerationGateError(f"generation {name} is WorkItem-owned; only `queue rollback` hands it to the Event path")
    return {"cutover": _prove_cutover(conn, registration_id, revision)}


def _refuse_claimable_work_items(conn: Connection, registration_id: str, revision: int) -> None:
    (count,) = conn.execute(
        f"SELECT count(*) FROM connector_work_items WHERE registration_id = %s AND revision = %s"
        f" AND state IN {sql_in(UNFINISHED)}",
        (registration_id, revision),
    ).fetchone()
    if count:
        raise GenerationGateError(
            f"generation {registration_id}@{revision} already has {count} claimable work items; activate it on the "
            "WorkItem path (or activate and roll it back)"
        )


def _prove_cutover(conn: Connection, registration_id: str, revision: int) -> dict[str, Any]:
    """Gates 2 and 5 for an Event-owned generation whose Event admission is stopped."""
    name = f"{registration_id}@{revision}"
    path = event_path.status(conn, registration_id, revision)
    if path.lease_holder is not None:
        raise GenerationGateError(
            f"generation {name}: the Event path's scheduler lease is still held by {path.lease_holder!r} "
            f"(until {path.lease_expires_at:%Y-%m-%d %H:%M:%S} UTC); wait for it to stop"
        )
    if path.started:
        raise GenerationGateError(
            f"generation {name}: {path.started} Event executions were left started by a lease holder that is gone; "
            f"run `queue event-drain {registration_id} {revision}` to settle them"
        )
    reconciled_now = legacy_outcomes.project(conn, registration_id, revision)
    fences = legacy_outcomes.fence_state(conn, registration_id, revision)
    if fences.unknown:
        raise GenerationGateError(
            f"generation {name}: {fences.unknown} fenced work items have an unknown legacy outcome (first: work "
            f"{fences.first_unknown}); confirm it with `queue fences confirm {fences.first_unknown} --outcome ...`"
        )
    if fences.awaiting:
        raise GenerationGateError(
            f"generation {name}: {fences.awaiting} fenced work items still await a terminal legacy outcome (first: "
            f"work {fences.first_awaiting}); let the Event path finish them"
        )
    if path.unknown:
        raise GenerationGateError(
            f"generation {name}: {path.unknown} Event executions have an unknown outcome; confirm them with "
            "`queue fences confirm WORK_ID --outcome ...`"
        )
    (to_materialize,) = conn.execute(
        f"""SELECT count(*) FROM event_executions x
             WHERE x.registration_id = %s AND x.revision = %s AND x.state IN {sql_in(EXECUTABLE)}
               AND x.rollback_fence_id IS NULL
               AND NOT EXISTS (SELECT 1 FROM connector_work_items w WHERE w.work_id = x.work_id)""",
        (registration_id, revision),
    ).fetchone()
    return {
        "scheduler_lease": None,
        "started_executions": 0,
        "fences": _verify_fences(conn, registration_id, revision),
        "reconciled_at_cutover": reconciled_now,
        "reconciled": fences.reconciled,
        "materialized_work_items": to_materialize,
    }


def _verify_fences(conn: Connection, registration_id: str, revision: int) -> dict[str, Any]:
    """Every fence's set is the one its receipt bound, and every item of it is reconciled
    with the digest of its work's latest receipt."""
    verified: dict[str, Any] = {}
    fences = conn.execute(
        """SELECT receipt_id, proof FROM workqueue_generation_receipts
            WHERE registration_id = %s AND revision = %s AND kind = 'rollback_fence' ORDER BY receipt_id""",
        (registration_id, revision),
    ).fetchall()
    for fence_id, proof in fences:
        count, set_digest, mismatched = conn.execute(
            """SELECT count(*), encode(sha256(convert_to(coalesce(string_agg(w.work_id::text, ',' ORDER BY w.work_id),
                                                                  ''), 'UTF8')), 'hex'),
                      count(*) FILTER (WHERE r.digest IS DISTINCT FROM w.legacy_outcome_digest)
                 FROM connector_work_items w
                 LEFT JOIN LATERAL (SELECT digest FROM legacy_outcome_receipts l WHERE l.work_id = w.work_id
                                     ORDER BY version DESC LIMIT 1) r ON true
                WHERE w.rollback_fence_id = %s""",
            (fence_id,),
        ).fetchone()
        if (count, set_digest) != (proof["fenced_items"], proof["fenced_set_digest"]) or mismatched:
            raise GenerationGateError(
                f"generation {registration_id}@{revision}: rollback fence {fence_id} does not match its receipt "
                f"({count} items, {mismatched} without their latest receipt's digest); refusing the cutover"
            )
        verified[str(fence_id)] = {"fenced_items": count, "fenced_set_digest": set_digest}
    return verified


def _transfer_unfinished(conn: Connection, registration_id: str, revision: int) -> None:
    """The Event path gives up its unfinished, unfenced work (it never ran to an outcome)."""
    conn.execute(
        f"""UPDATE event_executions SET state = '{TRANSFERRED}', updated_at = now()
             WHERE registration_id = %s AND revision = %s AND state IN {sql_in(EXECUTABLE)}
               AND rollback_fence_id IS NULL""",
        (registration_id, revision),
    )


def _materialize_transferred(conn: Connection, registration_id: str, revision: int) -> int:
    """Transferred work as work items with the same work ids: only events with no work item
    row (a reconciled row stays as it is)."""
    params = {"reg": registration_id, "rev": revision}
    return conn.execute(
        f"""INSERT INTO connector_work_items (work_id, event_id, registration_id, revision, work_type, queue_class,
                                              source_lane_key, target_lane_key, state, attempts, max_attempts,
                                              run_after)
            OVERRIDING SYSTEM VALUE
            SELECT x.work_id, x.event_id, x.registration_id, x.revision, x.work_type, x.queue_class,
                   x.source_lane_key, x.target_lane_key, CASE WHEN x.attempts = 0 THEN '{PENDING}' ELSE '{RETRY}' END,
                   x.attempts, x.max_attempts, x.run_after
              FROM event_executions x
             WHERE x.registration_id = %(reg)s AND x.revision = %(rev)s AND x.state = '{TRANSFERRED}'
               AND NOT EXISTS (SELECT 1 FROM connector_work_items w WHERE w.work_id = x.work_id)
             ORDER BY x.event_id, x.work_type""",
        params,
    ).rowcount


def quiesce(conn: Connection, registration_id: str, revision: int, *, recorded_by: str) -> DrainStatus:
    """Stop new claims (or Event starts) for the generation; returns its drain status."""
    with conn.transaction():
        current = lock_registration(conn, registration_id).get(revision)
        if current is None:
            raise GenerationGateError(f"generation {registration_id}@{revision} was never activated")
        if current.status == ROLLING_BACK:
            raise GenerationGateError(
                f"generation {registration_id}@{revision} is rolling back; finish with `queue rollback` or resume "
                "it with `queue activate`"
            )
        if current.status == ACTIVE:
            conn.execute(
                f"""UPDATE workqueue_generations SET status = '{QUIESCING}', updated_at = clock_timestamp()
                    WHERE registration_id = %s AND revision = %s""",
                (registration_id, revision),
            )
            write_receipt(conn, registration_id, revision, "quiesce", recorded_by,
                          {"previous_status": current.status, "claim_path": current.claim_path})
    return drain_status(conn, registration_id, revision)


def drain_status(conn: Connection, registration_id: str, revision: int) -> DrainStatus:
    row = conn.execute(
        "SELECT status, claim_path FROM workqueue_generations WHERE registration_id = %s AND revision = %s",
        (registration_id, revision),
    ).fetchone()
    status, path = row if row else (None, WORK_ITEM_PATH)
    if path == EVENT_PATH:
        events = event_path.status(conn, registration_id, revision)
        live = 1 if events.lease_holder is not None else 0
        return DrainStatus(registration_id, revision, status, live, events.started if not live else 0, EVENT_PATH,
                           events.started)
    active, expired = _lease_counts(conn, registration_id, revision)
    return DrainStatus(registration_id, revision, status, active, expired)


def record_drained(conn: Connection, registration_id: str, revision: int, *, recorded_by: str) -> GenerationReceipt:
    """Write the drain proof of a quiescing generation (no lease, nothing in flight); raises otherwise."""
    with conn.transaction():
        current = lock_registration(conn, registration_id).get(revision)
        if current is None or current.status not in (QUIESCING, QUIESCED):
            raise GenerationGateError(
                f"generation {registration_id}@{revision} is {current.status if current else 'unknown'!r}; "
                "quiesce it first"
            )
        status = drain_status(conn, registration_id, revision)
        if not status.drained:
            raise GenerationGateError(
                f"generation {registration_id}@{revision} still holds {status.active_leases} active and "
                f"{status.expired_leases} expired leases ({status.in_flight} started executions)"
            )
        if current.status == QUIESCED:
            existing = conn.execute(
                """SELECT receipt_id FROM workqueue_generation_receipts
                    WHERE registration_id = %s AND revision = %s AND kind = 'drained'
                    ORDER BY receipt_id DESC LIMIT 1""",
                (registration_id, revision),
            ).fetchone()
            if existing:
                return _receipt(conn, existing[0], registration_id, revision)
        proof = {"claim_path": current.claim_path, "active_leases": 0, "expired_leases": 0, "running_items": 0,
                 "started_executions": 0, "claims_admitted": False}
        receipt = write_receipt(conn, registration_id, revision, "drained", recorded_by, proof)
        conn.execute(
            f"""UPDATE workqueue_generations SET status = '{QUIESCED}', updated_at = clock_timestamp()
                WHERE registration_id = %s AND revision = %s""",
            (registration_id, revision),
        )
        return receipt
