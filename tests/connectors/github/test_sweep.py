"""GitHub through the shared reconciliation-sweep rows (pull requests are excluded items)."""

import itertools

import pytest

from nexus_pipelines.local.worlds.github import REPOSITORY_ID, GitHubWorld
from tests.connectors.sweep_suite import *  # noqa: F403 - the shared sweep rows run here for GitHub

_REPOSITORIES = itertools.count(REPOSITORY_ID)


@pytest.fixture
def make_world():
    return lambda: GitHubWorld(repository_id=next(_REPOSITORIES))
