"""Actor credentials: issued once, stored only as a scrypt hash with a salt of their own.

A credential reads `npa.<credential id>.<secret>`. The id (8 random bytes, hex) finds the
one row to check and is not secret; the secret is 32 random bytes. Verification derives
scrypt again with the row's salt and parameters and compares in constant time; the
parameters are stored per row so they can be raised without invalidating old ones.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

PREFIX = "npa"
KDF = "scrypt:n=16384,r=8,p=1,len=32"
_FORMAT = re.compile(r"^npa\.([0-9a-f]{16})\.([A-Za-z0-9_-]{43})$")
_KDF_FORMAT = re.compile(r"^scrypt:n=(\d+),r=(\d+),p=(\d+),len=(\d+)$")
# For a credential id that matches no row: verification still pays one derivation.
_DECOY_SALT = secrets.token_bytes(16)


class CredentialInvalid(ValueError):
    """Not a credential of this control plane (the message never repeats the input)."""


@dataclass(frozen=True)
class Issued:
    text: str  # shown once to the person it is issued to; never stored or logged
    credential_id: str
    kdf: str
    salt: bytes
    hash: bytes


def derive(secret: str, salt: bytes, kdf: str) -> bytes:
    match = _KDF_FORMAT.match(kdf)
    if match is None:
        raise CredentialInvalid(f"unknown key derivation {kdf!r}")
    n, r, p, length = (int(v) for v in match.groups())
    return hashlib.scrypt(secret.encode(), salt=salt, n=n, r=r, p=p, dklen=length, maxmem=64 * 1024 * 1024)


def issue() -> Issued:
    credential_id, secret, salt = secrets.token_hex(8), secrets.token_urlsafe(32), secrets.token_bytes(16)
    return Issued(f"{PREFIX}.{credential_id}.{secret}", credential_id, KDF, salt, derive(secret, salt, KDF))


def parse(text: str) -> tuple[str, str]:
    """(credential id, secret) of a well-formed credential."""
    match = _FORMAT.match(text.strip())
    if match is None:
        raise CredentialInvalid("that is not an actor credential (it reads npa.<id>.<secret>)")
    return match.group(1), match.group(2)


def matches(secret: str, salt: bytes | None, kdf: str | None, stored: bytes | None) -> bool:
    """Constant-time check; with no stored row it derives a decoy so timing says nothing."""
    if stored is None or salt is None or kdf is None:
        derive(secret, _DECOY_SALT, KDF)
        return False
    return hmac.compare_digest(derive(secret, salt, kdf), stored)
