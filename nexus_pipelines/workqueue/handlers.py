"""The explicit work-type -> handler registry.

A handler is a callable receiving the `ClaimedItem` (with its fencing token, so what
it writes can be fenced or keyed by it: `claims.lock_fence`). The same registry runs on
both claim paths: `item.claim_path` says which one runs it, and `item.work_id` names
the logical work on either, so effects keyed by it are written once. It returns an outcome
string (or None for "succeeded"); raising `PermanentError` dead-letters the item,
`RetryLater` retries it no sooner than the delay it names (a provider's Retry-After),
`Deferred` does too without spending an attempt (nothing was sent), any other exception is a retryable failure with the policy's backoff. A handler should check `item.lease_lost.is_set()` between
steps: the worker sets it when a renewal finds the lease gone, and from then on the
item's result is discarded.

A `Batched` handler takes a list of claimed items of its work type and returns one result
per item (an outcome, or the exception that item failed with); the drain hands it every
item of that type a claim brought (split over its threads), so it can apply them in one
transaction, each fenced by its own token (`claims.lock_fences`). Called with one item it
is an ordinary handler, so the Event path runs it unchanged. It can also complete its
WorkItem-path items in that same transaction (`complete_with_effects`): one statement and
one commit fewer per batch, and an item's completion commits or rolls back with its effects.

`NOOP` marks a work type whose handler does nothing: the worker completes such
items straight from the claim, with the same fenced statements.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from psycopg import Connection

from nexus_pipelines.workqueue import claims
from nexus_pipelines.workqueue.claims import ClaimedItem
from nexus_pipelines.workqueue.states import EVENT_PATH

Handler = Callable[[ClaimedItem], "str | None"]


class PermanentError(Exception):
    """The item can never succeed as it is: dead-letter it without further retries."""


class RetryLater(Exception):
    """Retry the item, but not before `delay_s` seconds (the policy's backoff if longer)."""

    def __init__(self, message: str, delay_s: float) -> None:
        super().__init__(message)
        self.delay_s = max(float(delay_s), 0.0)


class Deferred(RetryLater):
    """Nothing was sent (a provider's stated wait is in force): retry after `delay_s`, and
    the attempt is counted as unstarted, so it spends none of the item's attempt budget."""


@dataclass(frozen=True)
class Completed:
    """A batch item the handler completed itself, fenced by its token, in the transaction that
    wrote its effects: once that transaction commits, the drain only counts it."""

    outcome: str | None


BatchResult = "str | None | Completed | BaseException"


def complete_with_effects(conn: Connection, items: Sequence[ClaimedItem],
                          outcomes: Sequence[str | None]) -> list[str | None | Completed]:
    """Complete the WorkItem-path items among `items` (already locked by `claims.lock_fences` in
    the caller's transaction) with their outcomes, in that transaction; returns each item's
    batch result. Event-path items keep their plain outcome (their executor finalizes them),
    and so would an item the statement did not complete (the drain's fenced completion then
    decides). If the transaction fails, nothing is completed and the items take the drain's
    failure path."""
    by_outcome: dict[str | None, list[tuple[int, int]]] = {}
    for item, outcome in zip(items, outcomes):
        if item.claim_path != EVENT_PATH:
            by_outcome.setdefault(outcome, []).append(item.fence)
    done: set[int] = set()
    for outcome, fences in by_outcome.items():
        done |= claims.complete(conn, fences, outcome=outcome or "succeeded")
    return [Completed(outcome) if item.claim_path != EVENT_PATH and item.work_id in done else outcome
            for item, outcome in zip(items, outcomes)]


class Batched:
    """A handler applied to many items at once: `apply(items)` returns one `BatchResult` per item, in order."""

    def __init__(self, apply: Callable[[Sequence[ClaimedItem]], Sequence[BatchResult]]) -> None:
        self.apply = apply

    def __call__(self, item: ClaimedItem) -> str | None:
        (result,) = self.apply([item])
        if isinstance(result, BaseException):
            raise result
        return result.outcome if isinstance(result, Completed) else result


def _noop(item: ClaimedItem) -> None:
    return None


NOOP: Handler = _noop


class HandlerRegistry(Mapping[str, Handler]):
    """An immutable mapping of work type to handler."""

    def __init__(self, handlers: Mapping[str, Handler]) -> None:
        for work_type, handler in handlers.items():
            if not isinstance(work_type, str) or not work_type:
                raise ValueError(f"work type {work_type!r} must be a non-empty string")
            if not callable(handler):
                raise TypeError(f"handler for {work_type!r} is not callable")
        self._handlers = dict(handlers)

    def __getitem__(self, work_type: str) -> Handler:
        return self._handlers[work_type]

    def __iter__(self) -> Iterator[str]:
        return iter(self._handlers)

    def __len__(self) -> int:
        return len(self._handlers)

    @property
    def work_types(self) -> list[str]:
        return sorted(self._handlers)

    @property
    def all_noop(self) -> bool:
        return bool(self._handlers) and all(h is NOOP for h in self._handlers.values())
