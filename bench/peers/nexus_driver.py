"""nexus_pipelines.workqueue driver: pending until the work-queue drain API lands."""

from __future__ import annotations

OPTIONS = {}


def setup(dsn: str, n: int) -> None:
    raise NotImplementedError("nexus_pipelines.workqueue drain API not available yet")


def run_worker(dsn: str, worker_index: int, n: int, start_event) -> list[int]:
    raise NotImplementedError


def verify(dsn: str, n: int) -> dict:
    return {"queue_ok": False}
