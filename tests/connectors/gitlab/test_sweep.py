"""GitLab through the shared reconciliation-sweep rows, on keyset and on offset pages."""

import itertools

import pytest

from nexus_pipelines.local.worlds.gitlab import PROJECT_ID, GitLabWorld
from tests.connectors.sweep_suite import *  # noqa: F403 - the shared sweep rows run here for GitLab

_PROJECTS = itertools.count(PROJECT_ID)


@pytest.fixture(params=["keyset", "offset"])
def make_world(request):
    return lambda: GitLabWorld(project_id=next(_PROJECTS), keyset_for_issues=request.param == "keyset")
