"""Jira through the shared reconciliation-sweep rows (sub-tasks are excluded items)."""

import itertools

import pytest

from nexus_pipelines.local.worlds.jira import PROJECT_ID, JiraWorld
from tests.connectors.sweep_suite import *  # noqa: F403 - the shared sweep rows run here for Jira

_PROJECTS = itertools.count(PROJECT_ID)


@pytest.fixture
def make_world():
    return lambda: JiraWorld(project_id=next(_PROJECTS))
