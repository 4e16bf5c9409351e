"""RSA keys for GitHub App tests, made at test time: no private key is ever committed."""

from __future__ import annotations

from functools import lru_cache

from nexus_pipelines.local.simulators.github import app_key_pair

new_key_pair = app_key_pair


@lru_cache(maxsize=1)
def shared_key_pair() -> tuple[str, str]:
    """One key pair per test process (generating RSA keys is the slow part of a world)."""
    return app_key_pair()
