"""Retry policy (capped exponential backoff with jitter) and failure sanitizing."""

from __future__ import annotations

import random
from dataclasses import dataclass

from nexus_pipelines.backoff import capped_exponential
from nexus_pipelines.redaction import describe_exception, one_line

SUMMARY_LIMIT = 500

def sanitize_summary(text: str | None, limit: int = SUMMARY_LIMIT) -> str:
    """One bounded line with anything that looks like a secret or token removed."""
    return one_line(text, limit)


def summarize_exception(exc: BaseException, limit: int = SUMMARY_LIMIT) -> str:
    return describe_exception(exc, limit)


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with jitter.

    The delay before attempt n+1 (after n failed attempts) is
    `min(cap_s, base_s * 2**(n-1))`, scaled by a random factor in `[1 - jitter, 1]`.
    The attempt budget itself (`max_attempts`) is stored on each work item when it is
    created, so a policy change never rewrites the budget of queued work.
    """

    base_s: float = 1.0
    cap_s: float = 300.0
    jitter: float = 0.5
    max_attempts: int = 5

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.cap_s < self.base_s or not 0.0 <= self.jitter <= 1.0 or self.max_attempts < 1:
            raise ValueError(f"invalid retry policy {self!r}")

    def ceiling(self, attempts: int) -> float:
        return capped_exponential(attempts, self.base_s, self.cap_s)

    def delay(self, attempts: int, rng: random.Random | None = None) -> float:
        ceiling = self.ceiling(attempts)
        factor = 1.0 - self.jitter * (rng or random).random()
        return ceiling * factor


DEFAULT_POLICY = RetryPolicy()
