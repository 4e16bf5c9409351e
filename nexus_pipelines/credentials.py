"""Credential references: how configs name a secret without holding it.

A reference is `env:NAME` (an environment variable) or `file:/absolute/path` (a
mounted secret file, for example a GitHub App private key). Configs, the control
plane, cursors, run config and metadata only ever hold the reference; `resolve`
turns it into the value when a client is composed, and registers the value with the
redaction rule so that it can never be printed by accident.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from pydantic import SecretStr

from nexus_pipelines.redaction import MIN_REGISTERED_SECRET, register_secret

_REFERENCE = re.compile(r"^(env:[A-Z_][A-Z0-9_]{0,127}|file:/[^\s]{1,1023})$")


class SecretReferenceError(ValueError):
    """A reference is malformed or names nothing; the message names the reference, never a value."""


def check_reference(reference: str) -> str:
    """Validate the shape of a reference (for config validators)."""
    if not isinstance(reference, str) or not _REFERENCE.match(reference):
        raise SecretReferenceError(
            "a credential must be a reference such as env:GITLAB_TOKEN or file:/run/secrets/key, never a value"
        )
    return reference


def resolve(reference: str, *, environ: Mapping[str, str] | None = None) -> SecretStr:
    """The secret a reference names; raises SecretReferenceError naming the reference."""
    check_reference(reference)
    kind, _, name = reference.partition(":")
    if kind == "env":
        value = (os.environ if environ is None else environ).get(name, "").strip()
        if not value:
            raise SecretReferenceError(f"credential reference {reference} names an unset environment variable")
    else:
        path = Path(name)
        try:
            value = path.read_text().strip()
        except OSError as exc:
            raise SecretReferenceError(f"credential reference {reference} cannot be read ({exc.strerror})") from None
        if not value:
            raise SecretReferenceError(f"credential reference {reference} names an empty file")
    if len(value) < MIN_REGISTERED_SECRET:
        raise SecretReferenceError(
            f"credential reference {reference} holds a value shorter than {MIN_REGISTERED_SECRET} characters; "
            "that is not a real credential"
        )
    register_secret(value)
    return SecretStr(value)
