"""The static connector registry (CX-17): one reviewed row per first-party connector.

Adding a connector adds one row here; nothing is discovered or imported by name.
"""

from __future__ import annotations

from pathlib import Path

from nexus_pipelines.connectors import gitlab
from nexus_pipelines.connectors.core.registration import Registration, load_directory
from nexus_pipelines.connectors.core.registry import ConnectorRegistry
from nexus_pipelines.settings import PROJECT_ROOT

REGISTRY = ConnectorRegistry([gitlab.SPEC])
REGISTRATIONS_DIR = PROJECT_ROOT / "configs" / "connectors"


def load_registrations(directory: Path = REGISTRATIONS_DIR) -> dict[str, Registration]:
    """The registration files the code location ships, by registration id."""
    return load_directory(directory, REGISTRY) if directory.is_dir() else {}
