"""GitHub's answers classified: rate limits are throttling, never an authorization failure.

GitHub refuses for limits with 403 or 429: a primary limit says `x-ratelimit-remaining: 0`
until `x-ratelimit-reset`, a secondary limit sends `retry-after` or only a message. The
wait is the shared rule's (`connectors/rate_limits.py`, measured on GitHub's clock). Any
other 403 is a missing permission ("Resource not accessible by integration"), terminal.
A 3xx (a renamed or transferred repository answers 301 to GET and 307 to writes) is never
followed. GitHub documents at most 80 content-creating requests per minute: the
installation's gate holds the 81st write of a minute before GitHub has to refuse it.
"""

from __future__ import annotations

import httpx

from nexus_pipelines.connectors.github.app_auth import ProviderClock, refusal
from nexus_pipelines.connectors.provider_http import Problem, other_status_problem, redirect_problem
from nexus_pipelines.connectors.rate_limits import wait_seconds

LIMIT_STATUSES = frozenset({403, 429})
CONTENT_WRITES_PER_MINUTE = 80


def status_problem(response: httpx.Response, what: str, clock: ProviderClock) -> Problem:
    status = response.status_code
    said = refusal(response)
    moved = redirect_problem(response, what, " (the repository was renamed or transferred?)")
    if moved is not None:
        return moved
    if status in LIMIT_STATUSES:
        wait = wait_seconds(response, LIMIT_STATUSES, now=clock.now())
        if wait is not None:
            return Problem("retryable", "throttled", f"{what}: HTTP {status} rate limit: {said}"[:250], wait)
    if status == 401:
        return Problem("terminal", "authentication", f"{what}: HTTP 401 {said}: the installation token was refused "
                                                     "(revoked or expired); the next attempt mints a new one")
    if status == 403:
        return Problem("terminal", "authorization", f"{what}: HTTP 403 {said}: the App lacks issues: write or "
                                                    "metadata: read on the repository")
    return other_status_problem(response, what, said)
