"""Per registration, a `connectors/<tenant>/<key>/tickets` asset whose observations show
its ticket counts (total, untriaged, open, closed at the source) in the UI, and its
`triage_waits_less_than_max_age` check: it warns while any of the registration's
unresolved Attention findings is older than the configured age, so Dagster alerting can
tell someone (nothing expires or dismisses a finding)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetObservation,
    AssetSpec,
    MetadataValue,
    multi_asset_check,
)

from psycopg import Connection

from nexus_pipelines.connectors.core.tick import TickReport
from nexus_pipelines.control.resources import ControlPlaneResource
from nexus_pipelines.tickets.queries import TicketCounts, counts_by_registration, linked_refs, waiting_findings_by_registration

TRIAGE_AGE_CHECK = "triage_waits_less_than_max_age"


def tickets_asset_key(registration_id: str) -> AssetKey:
    tenant, _, key = registration_id.partition("/")
    return AssetKey(["connectors", re.sub(r"\W", "_", tenant), re.sub(r"\W", "_", key), "tickets"])


def tickets_asset_specs(registration_ids: Iterable[str]) -> list[AssetSpec]:
    return [
        AssetSpec(
            tickets_asset_key(rid),
            description=f"Tickets created from connector registration {rid}: observed by its poll runs, the "
                        "close-back proofs and the tickets observation schedule.",
            group_name="connectors",
            kinds={"postgres"},
            metadata={"registration": rid},
        )
        for rid in sorted(registration_ids)
    ]


def tickets_observation(registration_id: str, counts: TicketCounts | None, **extra: int | str) -> AssetObservation:
    counts = counts or TicketCounts(0, 0, 0, 0)
    metadata = {
        "total": MetadataValue.int(counts.total),
        "untriaged": MetadataValue.int(counts.untriaged),
        "open": MetadataValue.int(counts.open),
        "closed_at_source": MetadataValue.int(counts.closed),
    }
    for name, value in extra.items():
        metadata[name] = MetadataValue.int(value) if isinstance(value, int) else MetadataValue.text(str(value))
    return AssetObservation(asset_key=tickets_asset_key(registration_id), metadata=metadata)


class TicketObserver:
    """What a poll run reports about the tickets it feeds: how many of the admitted issue
    versions are new tickets, and one observation per touched registration. The poll job
    takes it as its `ticket_observer` resource, so connectors never import tickets."""

    def after_poll(self, conn: Connection, ticks: list[TickReport]) -> tuple[int, list[AssetObservation]]:
        counts = counts_by_registration(conn)
        linked = linked_refs(conn, [(t.registration_id, ref) for t in ticks for ref in t.admitted_refs])
        new_tickets = sum(1 for t in ticks for ref in t.admitted_refs if (t.registration_id, ref) not in linked)
        last = {t.registration_id: t for t in ticks}  # the last tick of each registration
        observations = [tickets_observation(rid, counts.get(rid), last_poll_cursor=tick.cursor or "(none)")
                        for rid, tick in sorted(last.items())]
        return new_tickets, observations


def triage_age_check(registration_ids: Iterable[str], max_age_hours: float):
    """One multi-check over every registration's tickets asset (None when there is none)."""
    ids = sorted(registration_ids)
    if not ids:
        return None
    limit_s = int(max_age_hours * 3600)
    specs = [AssetCheckSpec(TRIAGE_AGE_CHECK, asset=tickets_asset_key(rid),
                            description=f"No Attention finding (a triage, a sweep gap) waits for its owner longer "
                                        f"than {max_age_hours:g} h (NEXUS_TRIAGE_MAX_AGE_HOURS).") for rid in ids]

    @multi_asset_check(specs=specs, name="tickets_triage_age", description="Warn while triage waits too long.")
    def check(control_plane: ControlPlaneResource):
        with control_plane.connection() as conn:
            waiting = waiting_findings_by_registration(conn)
        for rid in ids:
            found = waiting.get(rid)
            oldest = found.oldest_age_s if found else 0
            yield AssetCheckResult(
                asset_key=tickets_asset_key(rid), check_name=TRIAGE_AGE_CHECK, passed=oldest <= limit_s,
                severity=AssetCheckSeverity.WARN,
                metadata={"unresolved_findings": MetadataValue.int(found.unresolved if found else 0),
                          "oldest_waiting_s": MetadataValue.int(oldest), "max_age_s": MetadataValue.int(limit_s)},
                description=(f"{found.unresolved} Attention findings wait for their owner, the oldest for "
                             f"{oldest // 3600} h" if found else "no Attention finding waits"))

    return check
