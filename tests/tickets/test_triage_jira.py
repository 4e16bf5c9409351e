"""The shared triage acceptance on real ingested Jira items."""

import itertools

import pytest

from nexus_pipelines.local.worlds.jira import PROJECT_ID, JiraWorld
from tests.tickets.triage_acceptance import *  # noqa: F403 - the shared triage acceptance runs here for Jira


@pytest.fixture
def make_world():
    project_ids = itertools.count(PROJECT_ID + 500)
    return lambda: JiraWorld(project_id=next(project_ids))
