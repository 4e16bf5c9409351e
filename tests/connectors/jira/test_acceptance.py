"""Jira through the shared real-Postgres acceptance."""

import itertools

import pytest

from tests.connectors.conformance.acceptance import *  # noqa: F403 - the shared acceptance runs here for Jira
from nexus_pipelines.local.worlds.jira import PROJECT_ID, JiraWorld


@pytest.fixture
def make_world():
    project_ids = itertools.count(PROJECT_ID)
    return lambda: JiraWorld(project_id=next(project_ids))
