"""The one rate-limit rule, on each provider's documented answers: which state a wait, how long."""

from __future__ import annotations

import email.utils

import httpx
import pytest

from nexus_pipelines.connectors.rate_limits import MIN_LIMIT_WAIT_S, RESET_SLACK_S, stated_wait

NOW = 1_800_000_000  # the provider's clock, given by each answer's Date
GITHUB, GITLAB, JIRA = frozenset({403, 429}), frozenset({429}), frozenset({429})
SECONDARY = {"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."}


def answer(status, headers=None, body=None):
    dated = {"Date": email.utils.formatdate(NOW, usegmt=True), **(headers or {})}
    return httpx.Response(status, headers=dated, json=body if body is not None else {})


@pytest.mark.parametrize("statuses, response, seconds", [
    (GITHUB, answer(403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(NOW + 600)}), 600 + RESET_SLACK_S),
    (GITHUB, answer(200, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(NOW + 90)}), 90 + RESET_SLACK_S),
    (GITHUB, answer(403, {"retry-after": "30", "x-ratelimit-remaining": "4000"}, SECONDARY), 30),
    (GITHUB, answer(429, {"x-ratelimit-remaining": "4000", "x-ratelimit-reset": str(NOW + 3000)}, SECONDARY),
     MIN_LIMIT_WAIT_S),
    (GITHUB, answer(403, {}, SECONDARY), MIN_LIMIT_WAIT_S),
    (GITHUB, answer(403, {"x-ratelimit-remaining": "4999", "x-ratelimit-reset": str(NOW + 3000)},
                    {"message": "Resource not accessible by integration"}), None),
    (GITHUB, answer(200, {"x-ratelimit-remaining": "1", "x-ratelimit-reset": str(NOW + 3000)}), None),
    (GITLAB, answer(429, {"Retry-After": "42", "RateLimit-Remaining": "0", "RateLimit-Reset": str(NOW + 50)}), 42),
    (GITLAB, answer(429, {"RateLimit-Reset": str(NOW + 50)}), 50 + RESET_SLACK_S),
    (GITLAB, answer(200, {"RateLimit-Remaining": "0", "RateLimit-Reset": str(NOW + 20)}), 20 + RESET_SLACK_S),
    (GITLAB, answer(429), MIN_LIMIT_WAIT_S),  # an application limit (note creation) sends no headers
    (GITLAB, answer(403, {"Retry-After": "42"}), None),
    (JIRA, answer(429, {"Retry-After": "7", "X-RateLimit-Reset": "2027-01-15T08:02Z"}), 7),
    (JIRA, answer(429, {"X-RateLimit-Reset": "2027-01-15T08:03Z"}), 180 + RESET_SLACK_S),
    (JIRA, answer(503, {"Retry-After": "30"}), None),  # a transient fault, not a limit
    (GITHUB, answer(429, {"retry-after": "999999"}), 86_400),
    (GITHUB, answer(200, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "9" * 400}), 86_400 + RESET_SLACK_S),
])
def test_each_documented_limit_answer_states_its_wait_and_no_other_answer_does(statuses, response, seconds):
    wait = stated_wait(response, statuses)
    assert (wait.seconds if wait else None) == seconds
