"""The writeback's blocking asset checks.

They are declared as `AssetCheckSpec(blocking=True)` on the assets they guard and
evaluated inside the writeback op as the run reaches them (see `assets.py` for why
the run is one op): readiness and freshness on `source_readiness`, null and duplicate
external IDs on `candidate_table`, mapping and field ownership on
`validated_payloads`. A failed check ends the run before the first CRM write, and
the check history shows in the UI next to each asset.
"""

from __future__ import annotations

from dagster import AssetCheckSpec, AssetKey

from nexus_pipelines.writeback.runner import (
    CHECK_KEYS_NOT_NULL,
    CHECK_KEYS_UNIQUE,
    CHECK_MAPPING,
    CHECK_SOURCE_FRESH,
    CHECK_SOURCE_READY,
)

CHECK_ASSET: dict[str, str] = {
    CHECK_SOURCE_READY: "readiness",
    CHECK_SOURCE_FRESH: "readiness",
    CHECK_KEYS_NOT_NULL: "candidates",
    CHECK_KEYS_UNIQUE: "candidates",
    CHECK_MAPPING: "validated",
}

CHECK_DESCRIPTIONS: dict[str, str] = {
    CHECK_SOURCE_READY: "The readiness query returns exactly one row and _outbound_source_ready is true.",
    CHECK_SOURCE_FRESH: "_outbound_source_as_of_at is within freshness_max_age_minutes.",
    CHECK_KEYS_NOT_NULL: "No candidate row has a null or empty _outbound_external_id (set-based query).",
    CHECK_KEYS_UNIQUE: "No _outbound_external_id occurs twice in the candidate table (set-based query).",
    CHECK_MAPPING: "Every row has the mapper's required columns and types and maps inside OWNED_FIELDS.",
}


def writeback_check_specs(asset_keys: dict[str, AssetKey]) -> list[AssetCheckSpec]:
    return [
        AssetCheckSpec(name=name, asset=asset_keys[role], blocking=True, description=CHECK_DESCRIPTIONS[name])
        for name, role in CHECK_ASSET.items()
    ]
