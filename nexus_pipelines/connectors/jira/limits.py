"""Jira Cloud's answers classified (developer.atlassian.com/cloud/jira/platform/rate-limiting).

A rate limit is a 429 with `Retry-After` (seconds) and `X-RateLimit-Reset` (ISO 8601, to
the minute), read by the shared rule (`connectors/rate_limits.py`); a 503 may carry
`Retry-After` too but is a transient fault, not a limit. An
API token with scopes that lacks one answers 401 "Unauthorized; scope does not match":
that is a missing permission, not a bad credential. Jira answers 404 for an issue the
account may not browse. A 3xx is never followed.
"""

from __future__ import annotations

import json

import httpx

from nexus_pipelines.connectors.provider_http import Problem, other_status_problem, redirect_problem
from nexus_pipelines.connectors.rate_limits import wait_seconds

SCOPE_REFUSAL = "scope does not match"


LIMIT_STATUSES = frozenset({429})  # a 503 with Retry-After is a transient fault, not a limit


def _scope_refused(response: httpx.Response) -> bool:
    try:
        message = json.loads(response.content).get("message", "")
    except (ValueError, AttributeError):
        return False
    return isinstance(message, str) and SCOPE_REFUSAL in message


def status_problem(response: httpx.Response, what: str) -> Problem:
    moved = redirect_problem(response, what, "")
    if moved is not None:
        return moved
    status = response.status_code
    if status == 401 and _scope_refused(response):
        return Problem("terminal", "authorization", f"{what}: HTTP 401 scope does not match: the API token lacks "
                                                    "read:jira-work or write:jira-work")
    if status == 401:
        return Problem("terminal", "authentication", f"{what}: HTTP 401: the API token is invalid, expired or revoked, "
                                                     "or provider.email is not its account")
    if status == 403:
        return Problem("terminal", "authorization", f"{what}: HTTP 403: the account lacks a project permission "
                                                    "(Browse projects, Add comments, Transition issues)")
    if status == 429:
        return Problem("retryable", "throttled", f"{what}: HTTP 429", wait_seconds(response, LIMIT_STATUSES))
    return other_status_problem(response, what)
