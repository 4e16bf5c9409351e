"""GitLab bound to the shift rows: a GitLab that does not offer keyset pagination for issues
answers offset pages."""

import pytest

from nexus_pipelines.local.worlds.gitlab import GitLabWorld
from tests.connectors.shifts import *  # noqa: F403 - the shift rows run here for GitLab


@pytest.fixture
def world():
    return GitLabWorld(keyset_for_issues=False)
