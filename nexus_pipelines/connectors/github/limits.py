"""GitHub's answers classified: rate limits are throttling, never an authorization failure.

GitHub refuses for limits with 403 or 429: a primary limit says `x-ratelimit-remaining: 0`
until `x-ratelimit-reset`, a secondary limit sends `retry-after` or only a message. The
wait is the shared rule's (`connectors/rate_limits.py`, measured on GitHub's clock). Any
other 403 is a missing permission ("Resource not accessible by integration"), terminal.
A 3xx (a renamed or transferred repository answers 301 to GET and 307 to writes) is never
followed.

GitHub's secondary limits allow at most 80 content-creating requests a minute and 500 an
hour. Of the requests this adapter sends only a comment creates content; closing an issue
(a PATCH of its state), the App's token exchange and every read create none. The
installation's gate (`CONTENT_BUDGET`) counts what `creates_content` says, and holds the
request past either limit before GitHub has to refuse it.
"""

from __future__ import annotations

from datetime import timedelta

import httpx

from nexus_pipelines.connectors.github.app_auth import ProviderClock, refusal
from nexus_pipelines.connectors.provider_gate import RequestBudget
from nexus_pipelines.connectors.provider_http import Problem, other_status_problem, redirect_problem
from nexus_pipelines.connectors.rate_limits import wait_seconds

LIMIT_STATUSES = frozenset({403, 429})
# whether each endpoint the adapter calls creates content on GitHub; an endpoint not named
# here is counted, so a request added without a decision can only make the budget stricter
CREATES_CONTENT = {"create_comment": True, "update_issue": False, "create_token": False,
                   "list_issues": False, "get_issue": False, "list_comments": False}


def creates_content(endpoint: str | None) -> bool:
    return CREATES_CONTENT.get(endpoint or "", True)


CONTENT_BUDGET = RequestBudget(windows=((timedelta(minutes=1), 80), (timedelta(hours=1), 500)),
                               counts=creates_content, what="content-creating requests")


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
