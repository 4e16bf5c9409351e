from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nexus_pipelines.workqueue.retry import RetryPolicy


@given(attempts=st.integers(min_value=1, max_value=60), seed=st.integers(0, 2**32))
def test_backoff_is_capped_exponential_with_bounded_jitter(attempts, seed):
    policy = RetryPolicy(base_s=0.5, cap_s=60, jitter=0.25)
    delay = policy.delay(attempts, random.Random(seed))
    ceiling = min(60, 0.5 * 2 ** (attempts - 1))
    assert ceiling * 0.75 <= delay <= ceiling


def test_backoff_grows_then_caps():
    policy = RetryPolicy(base_s=1, cap_s=10, jitter=0)
    assert [policy.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


@pytest.mark.parametrize("kwargs", [{"base_s": -1}, {"cap_s": 0.1, "base_s": 1}, {"jitter": 1.5}, {"max_attempts": 0}])
def test_invalid_policies_are_refused(kwargs):
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


@pytest.mark.parametrize(
    "text, secrets",
    [
        ("KeyError: {'password': 'hunter2', 'api_key': 'sk1234'}", ["hunter2", "sk1234"]),
        ("bad request api_key='abc123' token='zzz9'", ["abc123", "zzz9"]),
        ('{"client_secret": "s3cr3t"}', ["s3cr3t"]),
    ],
)
def test_sanitize_redacts_quoted_secret_values(text, secrets):
    from nexus_pipelines.workqueue.retry import sanitize_summary

    cleaned = sanitize_summary(text)
    assert all(secret not in cleaned for secret in secrets), cleaned
