"""Queue health as asset observations of the `workqueue_health` asset."""

from __future__ import annotations

from typing import Any

from dagster import AssetKey, AssetObservation, AssetSpec, MetadataValue

WORKQUEUE_HEALTH = AssetKey(["workqueue", "health"])

workqueue_health_spec = AssetSpec(
    WORKQUEUE_HEALTH,
    description="Work queue health (depth per state and queue class, oldest due age, leases, reclaim/retry/dead "
    "counts), observed by every drain and router run and by the health job.",
    group_name="workqueue",
    kinds={"postgres"},
)


def _flatten(health: dict[str, Any]) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for key, value in health.items():
        if isinstance(value, dict):
            metadata[key] = MetadataValue.json(value)
        elif isinstance(value, float):
            metadata[key] = MetadataValue.float(value)
        elif isinstance(value, int):
            metadata[key] = MetadataValue.int(value)
        else:
            metadata[key] = MetadataValue.text(str(value))
    return metadata


def health_observation(health: dict[str, Any], **extra: Any) -> AssetObservation:
    return AssetObservation(asset_key=WORKQUEUE_HEALTH, metadata=_flatten({**health, **extra}))
