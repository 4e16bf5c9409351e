"""Jira bound to the unchanged shared conformance suite."""

import pytest

from tests.connectors.conformance.suite import *  # noqa: F403 - the shared rows run here for Jira
from nexus_pipelines.local.worlds.jira import JiraWorld


@pytest.fixture
def world():
    return JiraWorld()
