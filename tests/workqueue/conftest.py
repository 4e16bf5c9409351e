"""Helpers for work queue tests: each test uses its own registration id, so tests of
one module share the module's database without seeing each other's items."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import pytest

from nexus_pipelines.workqueue.generations import activate
from nexus_pipelines.workqueue.receipts import NewWork, enqueue_work_items


@pytest.fixture
def reg() -> str:
    return f"reg-{uuid.uuid4().hex[:10]}"


def enqueue(conn, reg: str, items: Iterable[NewWork], *, revision: int = 1, activate_it: bool = True) -> int:
    count = enqueue_work_items(conn, items, registration_id=reg, revision=revision)
    if activate_it:
        activate(conn, reg, revision, recorded_by="test", route_versions={"bulk": 1})
    return count


def items(n: int, work_type: str = "t", **kw) -> list[NewWork]:
    return [NewWork(f"k{i}-{uuid.uuid4().hex[:6]}", work_type, **kw) for i in range(n)]


def state_of(conn, work_id: int) -> tuple:
    return conn.execute(
        "SELECT state, attempts, lease_token, reclaims FROM connector_work_items WHERE work_id = %s", (work_id,)
    ).fetchone()


def expire_leases(conn, reg: str) -> None:
    """Move lease deadlines into the past (as if the database clock had passed them)."""
    conn.execute(
        "UPDATE connector_work_items SET lease_until = now() - interval '1 second'"
        " WHERE registration_id = %s AND state = 'running'",
        (reg,),
    )
