"""GitHub bound to the shift rows: the listing links page numbers only (`page=N`)."""

import pytest

from nexus_pipelines.local.worlds.github import GitHubWorld
from tests.connectors.shifts import *  # noqa: F403 - the shift rows run here for GitHub


@pytest.fixture
def world():
    return GitHubWorld(issue_paging="page", on_sim_clock=True)
