"""RSA keys for GitHub App worlds, made at run time: no private key is ever committed."""

from __future__ import annotations

from functools import lru_cache

from nexus_pipelines.local.simulators.github import app_key_pair

new_key_pair = app_key_pair


@lru_cache(maxsize=1)
def shared_key_pair() -> tuple[str, str]:
    """One key pair per test process (generating RSA keys is the slow part of a world)."""
    return app_key_pair()


@lru_cache(maxsize=1)
def short_key_pair() -> tuple[str, str]:
    """One 1024-bit pair per test process, for tests that compose hundreds of adapters: every
    composition signs an App JWT, and loading a 2048-bit PEM key to sign is ten times slower
    (PyJWT warns about the length: `InsecureKeyLengthWarning`)."""
    return app_key_pair(key_size=1024)
