"""GitHub through the shared real-Postgres acceptance."""

import itertools

import pytest

from tests.connectors.conformance.acceptance import *  # noqa: F403 - the shared acceptance runs here for GitHub
from nexus_pipelines.local.worlds.github import REPOSITORY_ID, GitHubWorld


@pytest.fixture
def make_world():
    repository_ids = itertools.count(REPOSITORY_ID)
    return lambda: GitHubWorld(repository_id=next(repository_ids))
