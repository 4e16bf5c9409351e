"""The static connector registry (CX-17): one reviewed row per first-party connector.

Adding a connector adds one row here; nothing is discovered or imported by name.
"""

from __future__ import annotations

from pathlib import Path

from nexus_pipelines.connectors import github, gitlab, jira
from nexus_pipelines.connectors.core.registration import Registration, load_directory
from nexus_pipelines.connectors.core.registry import ConnectorRegistry
from nexus_pipelines.settings import PROJECT_ROOT, load_settings

REGISTRY = ConnectorRegistry([gitlab.SPEC, github.SPEC, jira.SPEC])
LOCAL_REGISTRATIONS_DIR = PROJECT_ROOT / "configs" / "connectors" / "local"


def load_registrations(directory: Path | None = None) -> dict[str, Registration]:
    """The registration files of `NEXUS_CONNECTORS_DIR` (or `directory`), by registration id."""
    directory = directory or load_settings().connectors_dir
    return load_directory(directory, REGISTRY) if directory.is_dir() else {}
