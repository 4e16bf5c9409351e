"""Committing a batch's evidence while the next batch's CRM call is in flight
(docs/design/writeback-run.md, "Batches").

One worker thread, on its own control-plane connection, runs one batch commit at a time:
the runner submits batch N's commit after N's answer is settled, sends batch N+1, and
collects N's commit (waiting for it if it is not done) before it submits N+1's. So at
most one sent batch waits for its evidence at any time, and a batch is reported only
once its commit returned.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Committed:
    tag: Any  # what the runner needs to report the batch
    result: Any  # what the commit returned
    started: float  # time.monotonic() when the commit began (a lease it renewed runs from then, or later)
    seconds: float  # the commit's own time, on the worker


class Committer:
    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="writeback-commit")
        self._pending: tuple[Future, Any] | None = None

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def submit(self, tag: Any, commit: Callable[[], Any]) -> None:
        if self._pending is not None:
            raise RuntimeError("a batch commit is still in flight")  # the caller collects first
        self._pending = (self._pool.submit(_timed, commit), tag)

    def collect(self) -> Committed | None:
        """Wait for the commit in flight (None when there is none); raises its error."""
        if self._pending is None:
            return None
        (future, tag), self._pending = self._pending, None
        result, began, seconds = future.result()
        return Committed(tag, result, began, seconds)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _timed(commit: Callable[[], Any]) -> tuple[Any, float, float]:
    began, started = time.monotonic(), time.perf_counter()
    return commit(), began, time.perf_counter() - started
