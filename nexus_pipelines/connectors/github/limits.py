"""GitHub's answers classified: rate limits are throttling, never an authorization failure.

Primary limit: 403 or 429 with `x-ratelimit-remaining: 0`, no request until
`x-ratelimit-reset` (UTC epoch seconds). Secondary limit: 403 or 429 with `retry-after`
(seconds), or with only a message, then at least a minute. Any other 403 is a missing
permission ("Resource not accessible by integration"), terminal. A 3xx (a renamed or
transferred repository answers 301 to GET and 307 to writes) is never followed.

`RateGate` remembers a spent primary budget from any response (a 200 can say
`remaining: 0` too), so no request is sent while GitHub would refuse it.
"""

from __future__ import annotations

from datetime import UTC, datetime

import httpx

from nexus_pipelines.connectors.github.app_auth import ProviderClock, refusal
from nexus_pipelines.connectors.provider_http import LONGEST_WAIT_S, Problem, other_status_problem, redirect_problem
from nexus_pipelines.integrations.http import parse_retry_after

SECONDARY_MIN_WAIT_S = 60.0
RESET_SLACK_S = 1.0  # GitHub's reset second has begun, not necessarily passed
MAX_RESET_WAIT_S = 86_400.0  # a reset further ahead is a day's wait (core throttles no longer either)


def _reset_wait(response: httpx.Response, clock: ProviderClock) -> float | None:
    reset = response.headers.get("x-ratelimit-reset", "")
    # ASCII digits only ("²".isdigit() is true, int() refuses it); compared before any float
    # arithmetic, so an epoch of hundreds of digits is a day's wait, not an OverflowError
    if response.headers.get("x-ratelimit-remaining") != "0" or not (reset.isascii() and reset.isdigit()):
        return None
    now, at = clock.now(), int(reset)
    return (MAX_RESET_WAIT_S if at > now + MAX_RESET_WAIT_S else max(at - now, 0.0)) + RESET_SLACK_S


def throttle_wait(response: httpx.Response, clock: ProviderClock) -> float | None:
    """Seconds to wait when this 403/429 is a rate limit, else None (a 403 for permissions)."""
    retry_after = parse_retry_after(response.headers.get("retry-after"))
    if retry_after is not None:
        return retry_after
    reset = _reset_wait(response, clock)
    if reset is not None:
        return reset
    if "rate limit" in refusal(response).lower() or response.status_code == 429:
        return SECONDARY_MIN_WAIT_S
    return None


def status_problem(response: httpx.Response, what: str, clock: ProviderClock) -> Problem:
    status = response.status_code
    said = refusal(response)
    moved = redirect_problem(response, what, " (the repository was renamed or transferred?)")
    if moved is not None:
        return moved
    if status in (403, 429):
        wait = throttle_wait(response, clock)
        if wait is not None:
            return Problem("retryable", "throttled", f"{what}: HTTP {status} rate limit: {said}"[:250], wait)
    if status == 401:
        return Problem("terminal", "authentication", f"{what}: HTTP 401 {said}: the installation token was refused "
                                                     "(revoked or expired); the next attempt mints a new one")
    if status == 403:
        return Problem("terminal", "authorization", f"{what}: HTTP 403 {said}: the App lacks issues: write or "
                                                    "metadata: read on the repository")
    return other_status_problem(response, what, said)


class RateGate:
    """Holds requests back while the last response said the primary budget is spent."""

    def __init__(self, clock: ProviderClock) -> None:
        self._clock = clock
        self._until = 0.0

    def observe(self, response: httpx.Response) -> None:
        wait = _reset_wait(response, self._clock)
        if wait is not None:
            self._until = max(self._until, self._clock.now() + wait)

    def closed(self, what: str) -> Problem | None:
        now = self._clock.now()
        # at most the seam's longest wait: a Date far ahead, later corrected, leaves `_until` past any calendar
        wait = min(self._until - now, LONGEST_WAIT_S)
        if wait <= 0:
            return None
        until = datetime.fromtimestamp(now + wait, UTC).strftime("%H:%M:%SZ")
        return Problem("retryable", "throttled", f"{what}: the rate budget is spent until {until} "
                                                 "(x-ratelimit-remaining 0); nothing was sent", wait)
