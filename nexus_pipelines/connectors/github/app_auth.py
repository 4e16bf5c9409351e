"""GitHub App credentials: the App JWT, the installation token it buys, and GitHub's clock.

The App JWT is RS256, `iss` the App id, `iat` 60 s in the past and `exp` nine minutes
ahead (GitHub refuses an `exp` more than ten minutes ahead of its own clock, so a minute
of local clock drift stays inside the limit). It is exchanged at
`POST /app/installations/{id}/access_tokens` for a token narrowed to the one repository
id with `issues: write` and `metadata: read`. The token lives in this object only (a
`SecretStr`, registered with the redaction rule), is replaced five minutes before the
`expires_at` GitHub gave it, and is dropped on any 401 so the next call mints again:
a revoked key or installation then fails closed at the mint.

Times are GitHub's: `ProviderClock` follows the `Date` header of every response, so a
skewed local clock neither signs JWTs GitHub rejects nor misjudges a token's expiry or
a rate-limit reset. The first JWT of a process is signed before any answer was seen: when
GitHub refuses it (401) with a `Date` showing its clock elsewhere, the adapter signs again
once on GitHub's clock (`SKEW_TOLERANCE_S`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import httpx
import jwt
from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError

from nexus_pipelines.connectors.provider_http import served_at
from nexus_pipelines.redaction import one_line, register_secret

JWT_BACKDATE_S = 60
JWT_LIFETIME_S = 540
REFRESH_MARGIN_S = 300
# A 401 to a JWT signed on a clock this far from the one the 401's `Date` shows is a skew, not a bad key.
SKEW_TOLERANCE_S = 5.0
TOKEN_PERMISSIONS = {"issues": "write", "metadata": "read"}


class ProviderClock:
    """GitHub's epoch seconds: the local clock plus the offset the last `Date` header showed."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._offset = 0.0

    def now(self) -> float:
        return self._clock() + self._offset

    @property
    def offset(self) -> float:
        """Seconds GitHub's clock is ahead of the local one, as the last `Date` showed."""
        return self._offset

    def observe(self, response: httpx.Response) -> None:
        served = served_at(response)
        if served is not None:
            self._offset = served.timestamp() - self._clock()


def app_jwt(app_id: int, private_key: SecretStr, now: float) -> str:
    """The App's JWT; raises CredentialError (naming no key material) when the key is unusable."""
    issued = int(now) - JWT_BACKDATE_S
    try:
        token = jwt.encode({"iat": issued, "exp": int(now) + JWT_LIFETIME_S, "iss": str(app_id)},
                           private_key.get_secret_value(), algorithm="RS256")
    except (ValueError, TypeError, jwt.PyJWTError) as exc:
        raise CredentialError(f"the private key of GitHub App {app_id} is not a usable RSA PEM key "
                              f"({type(exc).__name__})") from None
    register_secret(token)
    return token


class CredentialError(ValueError):
    """The App's key cannot sign; one line, never key material."""


class _Repository(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    id: int
    full_name: str


class _TokenAnswer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    token: str
    expires_at: datetime
    permissions: dict[str, str]
    repositories: list[_Repository]


@dataclass(frozen=True)
class Installation:
    """What a minted token is for: the App, its installation, the one repository."""

    app_id: int
    installation_id: int
    repository_id: int

    @property
    def path(self) -> str:
        return f"/app/installations/{self.installation_id}/access_tokens"

    def request_body(self) -> dict:
        return {"repository_ids": [self.repository_id], "permissions": dict(TOKEN_PERMISSIONS)}


class InstallationToken:
    """The current installation token and the repository name GitHub reported with it."""

    def __init__(self, installation: Installation, clock: ProviderClock) -> None:
        self._installation = installation
        self._clock = clock
        self._value: SecretStr | None = None
        self._expires_at = 0.0
        self.full_name: str | None = None

    def fresh(self) -> bool:
        return self._value is not None and self._clock.now() < self._expires_at - REFRESH_MARGIN_S

    def value(self) -> str:
        if self._value is None:
            raise RuntimeError("no installation token is held")  # the adapter mints before it sends
        return self._value.get_secret_value()

    def drop(self) -> None:
        self._value, self._expires_at = None, 0.0

    def accept(self, response: httpx.Response) -> str | None:
        """Store a 201 answer; returns what is wrong with it instead (one line), or None."""
        try:
            answer = _TokenAnswer.model_validate(json.loads(response.content), strict=False)
        except (ValueError, ValidationError):
            return "the access token answer does not parse"
        ids = sorted(r.id for r in answer.repositories)
        if ids != [self._installation.repository_id]:
            return (f"the token covers repositories {ids[:5]}, not exactly {self._installation.repository_id}; "
                    "refusing a token wider or other than the registration")
        granted = {k: answer.permissions.get(k) for k in TOKEN_PERMISSIONS}
        if granted != TOKEN_PERMISSIONS:
            return f"the token carries permissions {granted}, not {TOKEN_PERMISSIONS}"
        if answer.expires_at.tzinfo is None:
            return "the token's expires_at carries no time zone"
        register_secret(answer.token)
        self._value = SecretStr(answer.token)
        self._expires_at = answer.expires_at.timestamp()
        self.full_name = answer.repositories[0].full_name
        return None


def refusal(response: httpx.Response) -> str:
    """GitHub's own `message` of an error answer, redacted and short."""
    try:
        message = json.loads(response.content).get("message", "")
    except (ValueError, AttributeError):
        message = ""
    return one_line(message, 120) if isinstance(message, str) else ""
