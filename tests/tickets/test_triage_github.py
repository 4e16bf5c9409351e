"""The shared triage acceptance on real ingested GitHub items."""

import itertools

import pytest

from nexus_pipelines.local.worlds.github import REPOSITORY_ID, GitHubWorld
from tests.tickets.triage_acceptance import *  # noqa: F403 - the shared triage acceptance runs here for GitHub


@pytest.fixture
def make_world():
    repository_ids = itertools.count(REPOSITORY_ID + 500)
    return lambda: GitHubWorld(repository_id=next(repository_ids))
