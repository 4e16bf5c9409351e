"""Retry policy (capped exponential backoff with jitter) and failure sanitizing."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from nexus_pipelines.backoff import capped_exponential

SUMMARY_LIMIT = 500

_REDACTIONS: list[tuple[re.Pattern[str], str]] = [
    # credentials inside URLs: scheme://user:secret@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@"), r"\1[redacted]@"),
    # Authorization headers and bearer/basic tokens
    (re.compile(r"(?i)\b(authorization\s*[:=]\s*)(\S+\s+)?\S+"), r"\1[redacted]"),
    (re.compile(r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 [redacted]"),
    # key=value / key: value pairs whose key looks secret (quoted with " or ', as in a dict repr)
    (
        re.compile(
            r"(?i)\b([a-z0-9_-]*(?:password|passwd|secret|token|api[_-]?key|apikey|access[_-]?key|"
            r"private[_-]?key|client[_-]?secret|session|cookie|signature|credential)[a-z0-9_-]*)"
            r"([\"']?\s*[:=]\s*[\"']?)([^\s\"',;&}]+)"
        ),
        r"\1\2[redacted]",
    ),
    # JWTs and long opaque strings (hex, base64) that may be keys
    (re.compile(r"\beyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*"), "[redacted]"),
    (re.compile(r"\b[A-Za-z0-9+/_-]{32,}={0,2}"), "[redacted]"),
]


def sanitize_summary(text: str | None, limit: int = SUMMARY_LIMIT) -> str:
    """One bounded line with anything that looks like a secret or token removed."""
    if not text:
        return ""
    cleaned = " ".join(str(text).split())
    for pattern, replacement in _REDACTIONS:
        cleaned = pattern.sub(replacement, cleaned)
    if len(cleaned) > limit:
        cleaned = cleaned[: limit - 1] + "…"
    return cleaned


def summarize_exception(exc: BaseException, limit: int = SUMMARY_LIMIT) -> str:
    return sanitize_summary(f"{type(exc).__name__}: {exc}", limit)


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
