"""The shared triage acceptance on real ingested GitLab items."""

import itertools

import pytest

from nexus_pipelines.local.worlds.gitlab import PROJECT_ID, GitLabWorld
from tests.tickets.triage_acceptance import *  # noqa: F403 - the shared triage acceptance runs here for GitLab


@pytest.fixture
def make_world():
    project_ids = itertools.count(PROJECT_ID + 500)
    return lambda: GitLabWorld(project_id=next(project_ids))
