"""The static connector registry (docs/design/connector-contract.md, "The static registry and
the freeze set"): one reviewed row per first-party connector.

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


def registrations_dir() -> Path:
    """`NEXUS_CONNECTORS_DIR`: the folder the code location and the CLI load."""
    return load_settings().connectors_dir


def load_registrations(directory: Path | None = None) -> dict[str, Registration]:
    """The registration files of `NEXUS_CONNECTORS_DIR` (or `directory`), by registration id."""
    directory = directory or registrations_dir()
    return load_directory(directory, REGISTRY) if directory.is_dir() else {}


def why_empty(directory: Path) -> str:
    """One line for a folder that holds no registration: what is there instead and what to set."""
    if not directory.is_dir():
        return f"no registrations: {directory} is not a folder; set NEXUS_CONNECTORS_DIR to your registrations folder"
    nested = sorted({p.parent.relative_to(directory).as_posix() for p in directory.rglob("*.yaml")})
    hint = (f"; its subfolders {', '.join(f'{n}/' for n in nested)} hold registration files, which are loaded "
            "only when NEXUS_CONNECTORS_DIR names that folder (`. .nexus_local/env` sets configs/connectors/local)"
            if nested else "; add one (see configs/connectors/examples/ and the README)")
    return f"no registration files (*.yaml) directly in {directory}{hint}"
