"""GitLab bound to the unchanged shared conformance suite."""

import pytest

from tests.connectors.conformance.suite import *  # noqa: F403 - the shared rows run here for GitLab
from nexus_pipelines.local.worlds.gitlab import GitLabWorld


@pytest.fixture
def world():
    return GitLabWorld()
