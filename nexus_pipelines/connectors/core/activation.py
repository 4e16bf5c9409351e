"""Activating a registration revision: one revision is one work-queue generation
(docs/design/connector-contract.md, "Registrations and revisions").

A new revision of a key takes over only after the old one has stopped polling, its
receipts and work items have been processed, and its generation is quiesced with a
drain proof (docs/design/work-queue.md, "Quiesce and the drain proof"). The new revision
starts from its own empty cursor; custody keys on (tenant, registration key, external
ref), so re-reading issues the old revision already delivered creates nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from psycopg import Connection

from nexus_pipelines.connectors.core import store
from nexus_pipelines.connectors.core.registration import Registration
from nexus_pipelines.connectors.core.registry import ConnectorRegistry
from nexus_pipelines.workqueue import generations

# Runs the old generation's remaining work (route its receipts, drain its items) in process.
DrainOld = Callable[[str, int], None]


class ActivationRefused(RuntimeError):
    """The revision cannot take over yet; one line naming what still holds it back."""


@dataclass(frozen=True)
class ActivationResult:
    registration_id: str
    revision_id: str
    revision_no: int
    retired: tuple[str, ...]
    already_active: bool
    dead_left_behind: int = 0


def _open_work(conn: Connection, registration_id: str, revision_no: int) -> tuple[int, int, int]:
    (receipts,) = conn.execute(
        """SELECT count(*) FROM ingress_receipts WHERE registration_id = %s AND revision = %s
              AND routing_status IN ('pending', 'routing')""",
        (registration_id, revision_no),
    ).fetchone()
    items, dead = conn.execute(
        """SELECT count(*) FILTER (WHERE state IN ('pending', 'retry', 'running')), count(*) FILTER (WHERE state = 'dead')
             FROM connector_work_items WHERE registration_id = %s AND revision = %s""",
        (registration_id, revision_no),
    ).fetchone()
    return receipts, items, dead


def activate(
    conn: Connection,
    registration: Registration,
    registry: ConnectorRegistry,
    *,
    recorded_by: str,
    route_versions: Mapping[str, int],
    drain_old: DrainOld,
) -> ActivationResult:
    stored = store.register(conn, registration)
    rid = registration.registration_id
    if stored.status == "active":
        store.ensure_progress(conn, registration)
        generations.activate(conn, rid, stored.revision_no, recorded_by=recorded_by, route_versions=route_versions)
        return ActivationResult(rid, registration.revision_id, stored.revision_no, (), already_active=True)
    retired, dead_total = [], 0
    for old in store.revisions(conn, registry, rid):
        if old.registration.digest == registration.digest or old.status not in ("active", "retiring"):
            continue
        store.set_status(conn, old.registration, "retiring")  # the poll claim takes active revisions only
        if store.poll_lease_held(conn, old.registration):
            raise ActivationRefused(f"{old.registration.revision_id} is polling right now; run activate again when "
                                    "its tick has finished (at most its lease, 60 s)")
        drain_old(rid, old.revision_no)
        receipts, items, dead = _open_work(conn, rid, old.revision_no)
        if receipts or items:
            raise ActivationRefused(f"{old.registration.revision_id} still has {receipts} unrouted receipts and "
                                    f"{items} unfinished work items; run activate again to keep draining it")
        if generations.drain_status(conn, rid, old.revision_no).status == "active":
            generations.quiesce(conn, rid, old.revision_no, recorded_by=recorded_by)
        generations.record_drained(conn, rid, old.revision_no, recorded_by=recorded_by)
        store.set_status(conn, old.registration, "retired")
        retired.append(old.registration.revision_id)
        dead_total += dead
    with conn.transaction():
        generations.activate(conn, rid, stored.revision_no, recorded_by=recorded_by, route_versions=route_versions,
                             proof={"connector_revision": registration.revision_id, "digest": registration.digest,
                                    "retired": retired})
        store.set_status(conn, registration, "active")
        store.ensure_progress(conn, registration)
    return ActivationResult(rid, registration.revision_id, stored.revision_no, tuple(retired), already_active=False,
                            dead_left_behind=dead_total)
