"""NexusCRM OAuth 2.0 client_credentials as an `httpx.Auth`.

The flow fetches a token when it has none, sends the request with `Authorization:
Bearer`, and on a 401 refreshes the token and sends the request again. The refresh is
per expiry, not per call: a token that expires again later (after a refresh that
worked, during 503 or connection retries) is refreshed again. Only two 401s in a row
with no accepted call between them (a fresh token rejected too) are an authentication
failure; any other answer, or a request that got no answer at all (it may have been
applied), ends the row. Retries of transient failures are the caller's (the CRM
client's retry loop): a token request that fails transiently raises
`TokenUnavailable`.

Never logged or put in an exception: the client id and secret, tokens, the OAuth
response.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from nexus_pipelines.integrations.http import ENDPOINT, parse_retry_after
from nexus_pipelines.redaction import register_secret

REQUEST_LIMIT_EXCEEDED = "REQUEST_LIMIT_EXCEEDED"
_TRANSIENT_STATUSES = frozenset({408, 429})


class NexusCrmError(Exception):
    """Base of every error the NexusCRM client raises; messages are one line and secret-free."""


class AuthError(NexusCrmError):
    pass


class NexusCrmResponseError(NexusCrmError):
    """The API answered with an unexpected status or a body that breaks the contract."""


class ApiLimitExceeded(NexusCrmError):
    """403 REQUEST_LIMIT_EXCEEDED: the org's API allocation is spent (on any endpoint)."""

    def __init__(self, endpoint: str, usage: str | None, retry_after: float | None) -> None:
        self.usage = usage
        self.retry_after = retry_after
        seen = f" ({usage})" if usage else ""
        super().__init__(f"NexusCRM refused the {endpoint} call with 403 REQUEST_LIMIT_EXCEEDED: the org's daily "
                         f"API allocation is spent{seen}; try again when it recovers")


class TokenUnavailable(NexusCrmError):
    """The token endpoint failed transiently (408, 429, 5xx): retry later."""

    def __init__(self, status: int, retry_after: float | None) -> None:
        self.status = status
        self.retry_after = retry_after
        super().__init__(f"NexusCRM token endpoint answered HTTP {status}")


class OAuthToken(BaseModel):
    # Real token responses carry more keys (id, issued_at, signature, scope).
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    access_token: SecretStr = Field(min_length=1)
    instance_url: str = Field(min_length=1)
    token_type: str

    @field_validator("token_type")
    @classmethod
    def _bearer(cls, value: str) -> str:
        if value.lower() != "bearer":
            raise ValueError("token_type must be Bearer")
        return value


def validation_problem(exc: ValidationError) -> str:
    # Field paths only: pydantic's own text would echo the input values.
    return ", ".join(".".join(str(p) for p in e["loc"]) or "body" for e in exc.errors(include_input=False))


def parse_token(content: bytes) -> OAuthToken:
    try:
        return OAuthToken.model_validate_json(content)
    except ValidationError as exc:
        raise NexusCrmResponseError(f"NexusCRM token response is malformed ({validation_problem(exc)})") from None


def error_code(response: httpx.Response) -> str | None:
    """The code of a Salesforce error body (`[{"errorCode": ...}]`) or an OAuth one (`{"error": ...}`)."""
    try:
        body = response.json()
    except ValueError:
        return None
    if isinstance(body, list) and body and isinstance(body[0], dict):
        code = body[0].get("errorCode")
    elif isinstance(body, dict):
        code = body.get("error")
    else:
        return None
    return code if isinstance(code, str) and code.replace("_", "").isalnum() and len(code) <= 80 else None


def limit_exceeded(endpoint: str, response: httpx.Response) -> ApiLimitExceeded | None:
    if response.status_code == 403 and error_code(response) == REQUEST_LIMIT_EXCEEDED:
        usage = response.headers.get("Sforce-Limit-Info")
        return ApiLimitExceeded(endpoint, usage, parse_retry_after(response.headers.get("Retry-After")))
    return None


class ClientCredentialsAuth(httpx.Auth):
    """Bearer tokens from `token_url`, refreshed on each new expiry (see the module text).
    `check_token` validates a new token (its instance_url) before it is used."""

    requires_response_body = True

    def __init__(self, token_url: str, client_id: SecretStr, client_secret: SecretStr,
                 check_token: Callable[[OAuthToken], None]) -> None:
        self._token_url = token_url
        self._client_id = client_id
        self._client_secret = client_secret
        self._check_token = check_token
        self._token: OAuthToken | None = None
        self._rejections_in_a_row = 0

    def __repr__(self) -> str:
        return f"ClientCredentialsAuth(token_url={self._token_url!r})"

    @property
    def instance_url(self) -> str | None:
        return self._token.instance_url if self._token else None

    def invalidate(self) -> None:
        self._token = None

    def request_unanswered(self) -> None:
        """The caller's request got no answer (timeout, connection reset): not a rejection."""
        self._rejections_in_a_row = 0

    def token_request(self) -> httpx.Request:
        form = {
            "grant_type": "client_credentials",
            "client_id": self._client_id.get_secret_value(),
            "client_secret": self._client_secret.get_secret_value(),
        }
        return httpx.Request("POST", self._token_url, data=form, headers={"Accept": "application/json"},
                             extensions={ENDPOINT: "token"})

    def accept_token_response(self, response: httpx.Response) -> None:
        status = response.status_code
        limited = limit_exceeded("token", response)
        if limited:
            raise limited
        if status in _TRANSIENT_STATUSES or status >= 500:
            raise TokenUnavailable(status, parse_retry_after(response.headers.get("Retry-After")))
        if status != 200:
            code = error_code(response) or "no error code"
            raise AuthError(
                f"NexusCRM refused the OAuth client_credentials request (HTTP {status}, {code}); "
                "check the client id/secret and the Connected App"
            )
        token = parse_token(response.content)
        register_secret(token.access_token.get_secret_value())
        self._check_token(token)
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if self._token is None:
            self.accept_token_response((yield self.token_request()))
        response = yield self._authorized(request)
        while response.status_code == 401:
            self._rejections_in_a_row += 1
            if self._rejections_in_a_row >= 2:
                self._rejections_in_a_row = 0
                endpoint = request.extensions.get(ENDPOINT, "the request")
                raise AuthError(f"NexusCRM rejected a freshly issued token on {endpoint} (HTTP 401 twice in a row); "
                                "check the integration user's API access")
            self._token = None
            self.accept_token_response((yield self.token_request()))
            response = yield self._authorized(request)
        self._rejections_in_a_row = 0  # an accepted call: the next 401 is a new expiry

    def _authorized(self, request: httpx.Request) -> httpx.Request:
        assert self._token is not None
        request.headers["Authorization"] = f"Bearer {self._token.access_token.get_secret_value()}"
        return request
