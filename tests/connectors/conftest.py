from __future__ import annotations

import pytest

from nexus_pipelines.control.db import make_pool


@pytest.fixture(scope="module")
def pool(control_dsn):
    pool = make_pool(control_dsn, max_size=8)
    yield pool
    pool.close()
