"""The one rule for what a provider's answer says about its rate limits, for GitHub, GitLab
and Jira alike (docs/design/provider-gate.md).

An answer states a wait when:

* it is a limit refusal (a status the provider uses for limits: GitHub 403/429, GitLab
  and Jira 429) carrying `Retry-After` (seconds or an HTTP date);
* it names when the budget resets, with a remaining count of 0 (`x-ratelimit-remaining`,
  `RateLimit-Remaining`) on any status (a 200 can say so too), or with no remaining
  count on a limit refusal:
  epoch seconds as GitHub's `x-ratelimit-reset` and GitLab's `RateLimit-Reset`, or
  ISO 8601 to the minute as Jira's `X-RateLimit-Reset`;
* it is a limit refusal with neither: then at least a minute, as GitHub documents for a
  secondary limit that sends only a message (a GitHub 403 counts only when its message
  says "rate limit": any other 403 is a missing permission).

Waits are measured on the provider's clock (the answer's `Date`), so a skewed local clock
does not shorten them; a reset further ahead than a day is a day's wait.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from nexus_pipelines.connectors.provider_http import served_at
from nexus_pipelines.integrations.http import parse_retry_after

MIN_LIMIT_WAIT_S = 60.0  # a limit refusal naming no wait: GitHub's "wait at least one minute"
RESET_SLACK_S = 1.0  # the reset second has begun, not necessarily passed
MAX_RESET_WAIT_S = 86_400.0  # a reset further ahead is a day's wait
_REMAINING = ("x-ratelimit-remaining", "ratelimit-remaining")
_RESET = ("x-ratelimit-reset", "ratelimit-reset")


@dataclass(frozen=True)
class StatedWait:
    seconds: float
    said: str  # which header or rule named the wait, for the one-line detail


def _message(response: httpx.Response) -> str:
    try:
        message = json.loads(response.content).get("message", "")
    except (ValueError, AttributeError):
        return ""
    return message if isinstance(message, str) else ""


def _reset_epoch(value: str) -> float | None:
    # ASCII digits only ("²".isdigit() is true); an epoch of hundreds of digits is beyond
    # any clock (a day's wait), never a float overflow
    if value.isascii() and value.isdigit():
        return float("inf") if len(value) > 15 else float(value)
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%MZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _budget_spent(response: httpx.Response, now: float, refusal: bool) -> StatedWait | None:
    headers = response.headers
    remaining = [headers[name] for name in _REMAINING if name in headers]
    # GitHub dates every answer with its budget: a reset says "wait" only when nothing remains
    # (or, on a limit refusal, when no remaining count is given at all)
    if not ("0" in remaining or (refusal and not remaining)):
        return None
    for name in _RESET:
        at = _reset_epoch(headers.get(name, "").strip())
        if at is not None:
            wait = MAX_RESET_WAIT_S if at > now + MAX_RESET_WAIT_S else max(at - now, 0.0)
            return StatedWait(wait + RESET_SLACK_S, name.lower())
    return None


def stated_wait(response: httpx.Response, limit_statuses: frozenset[int],
                now: float | None = None) -> StatedWait | None:
    """The wait this answer states, or None (see the module docstring for the rule)."""
    served = served_at(response)
    now = now if now is not None else (served or datetime.now(UTC)).timestamp()
    refusal = response.status_code in limit_statuses
    if refusal:
        retry_after = parse_retry_after(response.headers.get("Retry-After"), datetime.fromtimestamp(now, UTC))
        if retry_after is not None:
            return StatedWait(min(retry_after, MAX_RESET_WAIT_S), "retry-after")
    spent = _budget_spent(response, now, refusal)
    if spent is not None or not refusal:
        return spent
    if response.status_code == 429 or "rate limit" in _message(response).lower():
        return StatedWait(MIN_LIMIT_WAIT_S, "a limit answer naming no wait: at least a minute")
    return None


def wait_seconds(response: httpx.Response, limit_statuses: frozenset[int], now: float | None = None) -> float | None:
    """The stated wait in seconds (what a throttled failure carries), or None."""
    wait = stated_wait(response, limit_statuses, now)
    return None if wait is None else wait.seconds
