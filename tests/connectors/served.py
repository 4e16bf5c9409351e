"""A GitLab simulator served over real HTTP on loopback with a registration file pointing at it,
for tests of the code paths that compose adapters with the real network (Dagster jobs, CLI)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from nexus_pipelines.connectors.core.registration import Registration, load_registration
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.local.simulators.gitlab import GitLabState, build_gitlab_app
from nexus_pipelines.local.simulators.http import serve_in_thread

PROJECT_ID = 4242


@dataclass
class ServedGitLab:
    state: GitLabState
    url: str
    folder: Path
    registration: Registration
    token_env: str
    token: str


def serve_gitlab(tmp_path: Path, *, key: str, token: str, token_env: str = "NEXUS_SERVED_GITLAB_TOKEN"):
    """(ServedGitLab, stop): the simulator on a free port and `<tmp>/connectors/<key>.yaml`."""
    state = GitLabState()
    state.add_project(PROJECT_ID, "acme/served")
    state.add_token(token, PROJECT_ID)
    url, stop = serve_in_thread(build_gitlab_app(state))
    folder = tmp_path / "connectors"
    folder.mkdir(exist_ok=True)
    path = folder / f"{key}.yaml"
    path.write_text(yaml.safe_dump({
        "key": key, "tenant": "acme", "project": "served", "kind": "gitlab", "poll_interval_seconds": 60,
        "provider": {"base_url": url, "project_id": PROJECT_ID, "token": f"env:{token_env}", "local_mode": True},
    }))
    return ServedGitLab(state, url, folder, load_registration(path, REGISTRY), token_env, token), stop
