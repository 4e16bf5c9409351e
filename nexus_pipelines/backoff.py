"""Capped exponential backoff, shared by the CRM client, the writeback ledger and the work queue."""

from __future__ import annotations

# 2**32 seconds is beyond any cap; stopping the exponent there keeps huge attempt
# counts from overflowing a float.
_MAX_EXPONENT = 32


def capped_exponential(attempt: int, base_s: float, cap_s: float) -> float:
    """`min(cap_s, base_s * 2**(attempt-1))` for attempt 1, 2, ...; jitter is the caller's choice."""
    return min(cap_s, base_s * 2 ** min(max(attempt - 1, 0), _MAX_EXPONENT))
