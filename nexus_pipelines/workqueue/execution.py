"""What the WorkItem drain and the Event-path executor do alike: run a handler and
classify its failure, decide when to stop, renew a lease on a heartbeat thread, and
report."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

from psycopg import Connection

from nexus_pipelines.workqueue.claims import ClaimedItem, Failure
from nexus_pipelines.workqueue.handlers import (
    Batched,
    Completed,
    Deferred,
    HandlerRegistry,
    PermanentError,
    RetryLater,
)
from nexus_pipelines.workqueue.retry import RetryPolicy, summarize_exception
from nexus_pipelines.workqueue.session import ControlSession


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(slots=True)
class HandlerResult:
    item: ClaimedItem
    outcome: str | None = None
    error: BaseException | None = None
    started: bool = True
    completed: bool = False  # by the handler, in the transaction of its effects (`Completed`)


def run_handler(registry: HandlerRegistry, item: ClaimedItem) -> HandlerResult:
    """Run the item's handler; an item whose lease was lost while it waited is not started."""
    if item.lease_lost.is_set():
        return HandlerResult(item, started=False)
    try:
        return HandlerResult(item, registry[item.work_type](item))
    except BaseException as exc:  # noqa: BLE001 - every handler failure is recorded on the item
        return HandlerResult(item, error=exc)


def run_batch(handler: Batched, items: list[ClaimedItem]) -> list[HandlerResult]:
    """Run a batch handler over the items whose lease is still held; a failure of the whole
    batch (its transaction) is every started item's failure."""
    results = {item.fence: HandlerResult(item, started=False) for item in items if item.lease_lost.is_set()}
    started = [item for item in items if item.fence not in results]
    if started:
        try:
            answers = list(handler.apply(started))
            if len(answers) != len(started):
                raise RuntimeError(f"a batch handler answered {len(answers)} results for {len(started)} items")
        except BaseException as exc:  # noqa: BLE001 - recorded on every item of the batch
            answers = [exc] * len(started)
        for item, answer in zip(started, answers):
            results[item.fence] = _batch_result(item, answer)
    return [results[item.fence] for item in items]


def _batch_result(item: ClaimedItem, answer) -> HandlerResult:
    if isinstance(answer, BaseException):
        return HandlerResult(item, error=answer)
    if isinstance(answer, Completed):
        return HandlerResult(item, answer.outcome, completed=True)
    return HandlerResult(item, answer)


def failure_for(item: ClaimedItem, exc: BaseException, policy: RetryPolicy) -> Failure:
    """The failed attempt to record: dead at once for a PermanentError, else retried after
    the policy's backoff (no sooner than a RetryLater's delay); a Deferred one is uncounted."""
    permanent = isinstance(exc, PermanentError)
    delay = policy.delay(item.attempts)
    if isinstance(exc, RetryLater):
        delay = max(delay, exc.delay_s)
    return Failure(
        item.work_id,
        item.token,
        "permanent" if permanent else type(exc).__name__,
        summarize_exception(exc),
        delay,
        terminal=permanent,
        uncounted=isinstance(exc, Deferred),
    )


class StopRule:
    """When an executor stops starting work: a stop event, a time budget or an item cap."""

    def __init__(
        self, stop_event: threading.Event | None, time_budget_s: float | None, max_items: int | None
    ) -> None:
        self.started = time.monotonic()
        self.deadline = self.started + time_budget_s if time_budget_s is not None else None
        self._stop_event = stop_event
        self.max_items = max_items

    def reason(self, claimed: int) -> str:
        if self._stop_event is not None and self._stop_event.is_set():
            return "stopped"
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "time_budget"
        if self.max_items is not None and claimed >= self.max_items:
            return "max_items"
        return ""

    def room(self, claimed: int, wanted: int) -> int:
        return wanted if self.max_items is None else max(min(wanted, self.max_items - claimed), 0)

    def idle_wait(self, poll_interval_s: float) -> None:
        wait = poll_interval_s
        if self.deadline is not None:
            wait = min(wait, max(self.deadline - time.monotonic(), 0))
        if self._stop_event is not None:
            self._stop_event.wait(wait)
        else:
            time.sleep(wait)


class Heartbeat(threading.Thread):
    """Calls `beat(conn)` every `interval_s` on its own session, holding `db_lock` meanwhile
    so the executor can keep its own statements on the same rows from running at once.
    A beat that raises ends the heartbeat: `error` holds it and `on_error` runs."""

    def __init__(
        self,
        session: ControlSession,
        beat: Callable[[Connection], None],
        interval_s: float,
        on_error: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(name="workqueue-heartbeat", daemon=True)
        self.session = session
        self._beat = beat
        self._interval = interval_s
        self._on_error = on_error
        self._halt = threading.Event()
        self.db_lock = threading.Lock()
        self.error: BaseException | None = None

    def start(self) -> None:
        # Connected before the first beat: an outage that begins before it is then a lost
        # connection the session waits out, like any other.
        self.session.open()
        super().start()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            while not self._halt.wait(self._interval):
                with self.db_lock:
                    self.session.run(self._beat)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the executor
            self.error = exc
            self._on_error()
        finally:
            self.session.close()


@dataclass
class DrainReport:
    worker_id: str
    claimed: int = 0
    completed: int = 0
    retried: int = 0
    dead: int = 0
    lost: int = 0
    reclaimed_retry: int = 0
    reclaimed_dead: int = 0
    claim_statements: int = 0
    claim_s: float = 0.0  # time spent in claim statements (round trip included)
    finalize_s: float = 0.0  # time spent in completion / failure statements
    elapsed_s: float = 0.0
    stopped: str = ""
    outages: int = 0  # control-plane connections lost and re-established
    outage_s: float = 0.0
    statement_retries: int = 0  # statements retried after a deadlock / lock timeout

    @property
    def items_per_s(self) -> float:
        return self.completed / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def add_session(self, session: ControlSession) -> None:
        self.outages += session.outages
        self.outage_s += session.outage_s
        self.statement_retries += session.statement_retries

    def as_dict(self) -> dict:
        data = asdict(self)
        data["items_per_s"] = round(self.items_per_s, 1)
        for key in ("elapsed_s", "claim_s", "finalize_s", "outage_s"):
            data[key] = round(data[key], 3)
        return data
