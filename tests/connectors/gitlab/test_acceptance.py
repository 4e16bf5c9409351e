"""GitLab through the shared real-Postgres acceptance."""

import itertools

import pytest

from tests.connectors.conformance.acceptance import *  # noqa: F403 - the shared acceptance runs here for GitLab
from nexus_pipelines.local.worlds.gitlab import PROJECT_ID, GitLabWorld


@pytest.fixture
def make_world():
    project_ids = itertools.count(PROJECT_ID)
    return lambda: GitLabWorld(project_id=next(project_ids))
