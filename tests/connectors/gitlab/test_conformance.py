"""GitLab bound to the unchanged shared conformance suite."""

import pytest

from tests.connectors.conformance.suite import *  # noqa: F403 - the shared rows run here for GitLab
from tests.connectors.gitlab.harness import GitLabWorld


@pytest.fixture
def world():
    return GitLabWorld()
