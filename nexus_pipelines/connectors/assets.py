"""Per registration, a `connectors/<tenant>/<key>/tickets` asset whose observations show
its ticket counts (total, untriaged, open, closed at the source) in the UI."""

from __future__ import annotations

import re
from collections.abc import Iterable

from dagster import AssetKey, AssetObservation, AssetSpec, MetadataValue

from nexus_pipelines.tickets.queries import TicketCounts


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
