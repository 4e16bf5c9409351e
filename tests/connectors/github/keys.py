"""RSA keys for GitHub App tests, made at test time: no private key is ever committed."""

from __future__ import annotations

from functools import lru_cache

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


def new_key_pair() -> tuple[str, str]:
    """(private PEM, public PEM) of a fresh 2048-bit key."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private, public


@lru_cache(maxsize=1)
def shared_key_pair() -> tuple[str, str]:
    """One key pair per test process (generating RSA keys is the slow part of a world)."""
    return new_key_pair()
