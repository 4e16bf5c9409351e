"""GitHub bound to the unchanged shared conformance suite."""

import pytest

from tests.connectors.conformance.suite import *  # noqa: F403 - the shared rows run here for GitHub
from tests.connectors.github.harness import GitHubWorld


@pytest.fixture
def world():
    return GitHubWorld()
