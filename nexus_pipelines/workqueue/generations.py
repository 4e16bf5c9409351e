"""Generation gates: activation receipts, quiesce, drain proof (seed gates 1 to 3).

The work items of a (registration, revision) are claimable only while its row in
`workqueue_generations` is 'active', and that row only becomes 'active' together
with a durable, immutable activation receipt in `workqueue_generation_receipts`
(which binds the route versions that replay will later check). A partial unique
index allows one active generation per registration, so two claimable generations
of one registration cannot exist.

Claims take `FOR KEY SHARE` on the generation rows they use and `quiesce` takes
`FOR UPDATE`, so once `quiesce` commits no claim for that generation can start or
still be in flight; running items finish (or expire and are reclaimed). `drain_status`
counts the generation's leases and `record_drained` writes the zero-lease proof.

Ambiguous ownership fails closed: activation is refused while another revision of
the registration is active or quiescing without a drain proof, and for generations in
the reserved rollback states ('rolling_back', 'legacy'); rollback fencing (gates 4
and 5) will add those transitions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psycopg import Connection
from psycopg.types.json import Jsonb

CLAIM_SCHEMA = "0010_workqueue"
_RESERVED = ("rolling_back", "legacy")


class GenerationGateError(RuntimeError):
    """A generation gate cannot be proven; nothing was changed."""


@dataclass(frozen=True)
class DrainStatus:
    registration_id: str
    revision: int
    status: str | None
    active_leases: int
    expired_leases: int

    @property
    def drained(self) -> bool:
        return self.active_leases == 0 and self.expired_leases == 0


@dataclass(frozen=True)
class GenerationReceipt:
    receipt_id: int
    registration_id: str
    revision: int
    kind: str
    proof: dict[str, Any]


def _lock_registration(conn: Connection, registration_id: str) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('workqueue-generation:' || %s, 0))", (registration_id,))


def _lock_generation(conn: Connection, registration_id: str, revision: int) -> tuple[str] | None:
    """Serialize with every gate change of the registration; the generation's (status,) or None."""
    _lock_registration(conn, registration_id)
    return conn.execute(
        "SELECT status FROM workqueue_generations WHERE registration_id = %s AND revision = %s FOR UPDATE",
        (registration_id, revision),
    ).fetchone()


def _write_receipt(
    conn: Connection, registration_id: str, revision: int, kind: str, recorded_by: str, proof: dict[str, Any]
) -> GenerationReceipt:
    (receipt_id,) = conn.execute(
        """INSERT INTO workqueue_generation_receipts (registration_id, revision, kind, recorded_by, proof)
           VALUES (%s, %s, %s, %s, %s) RETURNING receipt_id""",
        (registration_id, revision, kind, recorded_by, Jsonb(proof)),
    ).fetchone()
    return GenerationReceipt(receipt_id, registration_id, revision, kind, proof)


def _lease_counts(conn: Connection, registration_id: str, revision: int) -> tuple[int, int]:
    active, expired = conn.execute(
        """SELECT count(*) FILTER (WHERE lease_until > now()), count(*) FILTER (WHERE lease_until <= now())
             FROM connector_work_items
            WHERE state = 'running' AND lease_owner IS NOT NULL AND lease_until IS NOT NULL
              AND registration_id = %s AND revision = %s""",
        (registration_id, revision),
    ).fetchone()
    return active, expired


def activate(
    conn: Connection,
    registration_id: str,
    revision: int,
    *,
    recorded_by: str,
    route_versions: Mapping[str, int],
    proof: Mapping[str, Any] | None = None,
) -> GenerationReceipt:
    """Write the durable activation receipt and make the generation claimable.

    Idempotent for an already active generation (returns its activation receipt).
    Raises GenerationGateError when ownership is ambiguous.
    """
    with conn.transaction():
        _lock_registration(conn, registration_id)
        rows = conn.execute(
            """SELECT revision, status, activation_receipt_id FROM workqueue_generations
                WHERE registration_id = %s FOR UPDATE""",
            (registration_id,),
        ).fetchall()
        by_revision = {r[0]: (r[1], r[2]) for r in rows}
        current = by_revision.get(revision)
        if current is not None and current[0] == "active":
            row = conn.execute(
                "SELECT receipt_id, kind, proof FROM workqueue_generation_receipts WHERE receipt_id = %s",
                (current[1],),
            ).fetchone()
            return GenerationReceipt(row[0], registration_id, revision, row[1], row[2])
        if current is not None and current[0] in _RESERVED:
            raise GenerationGateError(
                f"generation {registration_id}@{revision} is {current[0]!r} (another claim path owns it); "
                "refusing to activate WorkItem claims"
            )
        others: dict[str, Any] = {}
        for other, (status, _receipt) in sorted(by_revision.items()):
            if other == revision:
                continue
            if status == "active":
                raise GenerationGateError(
                    f"revision {other} of {registration_id} is still active; quiesce it and record its drain "
                    f"proof before activating revision {revision}"
                )
            if status in ("quiescing", *_RESERVED):
                raise GenerationGateError(
                    f"revision {other} of {registration_id} is {status!r} without a drain proof; run "
                    f"`queue quiesce {registration_id} {other}` until it reports drained"
                )
            active, expired = _lease_counts(conn, registration_id, other)
            if active or expired:
                raise GenerationGateError(
                    f"revision {other} of {registration_id} still holds {active + expired} work item leases"
                )
            others[str(other)] = {"status": status, "leases": 0}
        receipt_proof = {
            **dict(proof or {}),  # the caller's extra evidence never replaces the verified gate proof
            "claim_schema": CLAIM_SCHEMA,
            "route_versions": {k: int(v) for k, v in route_versions.items()},
            "other_revisions": others,
        }
        receipt = _write_receipt(conn, registration_id, revision, "activation", recorded_by, receipt_proof)
        conn.execute(
            """INSERT INTO workqueue_generations (registration_id, revision, status, activation_receipt_id,
                                                  route_versions)
               VALUES (%(reg)s, %(rev)s, 'active', %(receipt)s, %(routes)s)
               ON CONFLICT (registration_id, revision) DO UPDATE
                  SET status = 'active', activation_receipt_id = EXCLUDED.activation_receipt_id,
                      route_versions = EXCLUDED.route_versions, updated_at = clock_timestamp()""",
            {
                "reg": registration_id,
                "rev": revision,
                "receipt": receipt.receipt_id,
                "routes": Jsonb(receipt_proof["route_versions"]),
            },
        )
        return receipt


def quiesce(conn: Connection, registration_id: str, revision: int, *, recorded_by: str) -> DrainStatus:
    """Stop new claims for the generation; returns its lease counts (drained when both are zero)."""
    with conn.transaction():
        row = _lock_generation(conn, registration_id, revision)
        if row is None:
            raise GenerationGateError(f"generation {registration_id}@{revision} was never activated")
        status = row[0]
        if status in _RESERVED:
            raise GenerationGateError(f"generation {registration_id}@{revision} is {status!r}; cannot quiesce")
        if status == "active":
            conn.execute(
                """UPDATE workqueue_generations SET status = 'quiescing', updated_at = clock_timestamp()
                    WHERE registration_id = %s AND revision = %s""",
                (registration_id, revision),
            )
            _write_receipt(conn, registration_id, revision, "quiesce", recorded_by, {"previous_status": status})
            status = "quiescing"
    return drain_status(conn, registration_id, revision)


def drain_status(conn: Connection, registration_id: str, revision: int) -> DrainStatus:
    row = conn.execute(
        "SELECT status FROM workqueue_generations WHERE registration_id = %s AND revision = %s",
        (registration_id, revision),
    ).fetchone()
    active, expired = _lease_counts(conn, registration_id, revision)
    return DrainStatus(registration_id, revision, row[0] if row else None, active, expired)


def record_drained(conn: Connection, registration_id: str, revision: int, *, recorded_by: str) -> GenerationReceipt:
    """Write the drain proof of a quiescing generation (zero leases); raises while leases remain."""
    with conn.transaction():
        row = _lock_generation(conn, registration_id, revision)
        if row is None or row[0] not in ("quiescing", "quiesced"):
            raise GenerationGateError(
                f"generation {registration_id}@{revision} is {row[0] if row else 'unknown'!r}; quiesce it first"
            )
        active, expired = _lease_counts(conn, registration_id, revision)
        if active or expired:
            raise GenerationGateError(
                f"generation {registration_id}@{revision} still holds {active} active and {expired} expired leases"
            )
        if row[0] == "quiesced":
            existing = conn.execute(
                """SELECT receipt_id, proof FROM workqueue_generation_receipts
                    WHERE registration_id = %s AND revision = %s AND kind = 'drained'
                    ORDER BY receipt_id DESC LIMIT 1""",
                (registration_id, revision),
            ).fetchone()
            if existing:
                return GenerationReceipt(existing[0], registration_id, revision, "drained", existing[1])
        proof = {"active_leases": 0, "expired_leases": 0, "running_items": 0, "claims_admitted": False}
        receipt = _write_receipt(conn, registration_id, revision, "drained", recorded_by, proof)
        conn.execute(
            """UPDATE workqueue_generations SET status = 'quiesced', updated_at = clock_timestamp()
                WHERE registration_id = %s AND revision = %s""",
            (registration_id, revision),
        )
        return receipt
