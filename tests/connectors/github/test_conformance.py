"""GitHub bound to the unchanged shared conformance suite."""

import pytest

from tests.connectors.conformance.suite import *  # noqa: F403 - the shared rows run here for GitHub
from nexus_pipelines.local.worlds.github import GitHubWorld


@pytest.fixture
def world():
    return GitHubWorld()
