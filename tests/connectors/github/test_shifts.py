"""GitHub bound to the shift rows: the listing links page numbers only (`page=N`)."""

import pytest

from tests.connectors.github.harness import GitHubWorld
from tests.connectors.shifts import *  # noqa: F403 - the shift rows run here for GitHub


@pytest.fixture
def world():
    return GitHubWorld(issue_paging="page", on_sim_clock=True)
