"""The one redaction rule: what may never leave a process in a log line, an exception, a
ledger column, a work-item summary or run metadata.

Redaction is by value. The project resolves every credential itself (`credentials.resolve`,
the NexusCRM client credentials and access tokens, GitHub App JWTs and installation tokens,
the Jira Basic pair), and each resolved value is registered here with its base64 and
URL-encoded forms; `redact` replaces those exact strings wherever they appear. Behind them
stand the documented token shapes, for a credential the process never resolved (pasted into
a provider message, echoed by a proxy): GitHub `ghp_`/`gho_`/`ghu_`/`ghs_`/`ghr_`/
`github_pat_`, GitLab `glpat-` and its siblings, Atlassian `ATATT3`, JWTs, PEM private key
blocks, credentials inside URLs, Authorization-style headers with Bearer/Basic values, and
`key=value` pairs whose key names a secret; emails (customer data) become `[email]`.
Nothing else is touched: run ids, batch ids, UUIDs, paths and registration keys stay
readable. `looks_like_secret`, the check on literal config values, uses the same shapes.

`one_line` also folds whitespace, writes control characters as escapes (a NUL cannot be
stored in Postgres text) and bounds the length, which is what every summary, error message
and ledger column wants.
"""

from __future__ import annotations

import base64
import re
import threading
from urllib.parse import quote, quote_plus

REDACTED = "[redacted]"

# Each shape marks the secret part as the group `secret`; the text around it stays.
_SECRET_SHAPES: tuple[re.Pattern[str], ...] = (
    # documented provider token prefixes
    re.compile(r"\b(?P<secret>(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9._-]{30,}|github_pat_[A-Za-z0-9_]{30,})"),
    re.compile(r"\b(?P<secret>gl(?:pat|dt|rt|ptt|cbt|oas|soat|ft|imt|agent)-[A-Za-z0-9_.-]{20,})"),
    re.compile(r"\b(?P<secret>ATATT3[A-Za-z0-9_=-]{20,})"),
    # JWTs: base64url header `{"...`, payload, signature
    re.compile(r"\b(?P<secret>eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*)"),
    # PEM private key blocks (to the end of the text when the END line was cut off)
    re.compile(r"(?P<secret>-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$))", re.S),
    # credentials inside URLs: scheme://user:secret@host
    re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://(?P<secret>[^/\s:@]+:[^/\s@]+)@"),
    # Authorization-style headers, also as a quoted dict entry: the whole value
    re.compile(r"(?i)\b(?:proxy-)?(?:authorization|private-token|x-api-key)[\"']?\s*[:=]\s*[\"']?"
               r"(?P<secret>(?:(?:bearer|basic|token)\s+)?[^\s\"',;]+)"),
    # Bearer and Basic credentials anywhere; a Basic credential is base64 with a digit or padding,
    # which tells it from prose such as "Basic authentication"
    re.compile(r"(?i)\bbearer\s+(?P<secret>[^\s\"',;]+)"),
    re.compile(r"(?i)\bbasic\s+(?P<secret>(?=[^\s\"',;]*[0-9+/=])[A-Za-z0-9+/=]{8,})"),
    # key=value / "key": "value" pairs whose key ends in a secret's name
    re.compile(
        r"(?i)\b[a-z0-9_-]*(?:password|passwd|secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key|"
        r"cookie|signature)[\"']?\s*[:=]\s*[\"']?(?P<secret>[^\s\"',;&}]+)"
    ),
)
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(\.[\w-]+)+")

_known: set[str] = set()
_known_lock = threading.Lock()
# Short values would redact ordinary words; references to such secrets are refused when
# they are resolved (see credentials.resolve).
MIN_REGISTERED_SECRET = 8


def encoded_forms(value: str) -> set[str]:
    """`value` as it may appear in text that left the process: itself, base64 (standard and
    URL-safe, with and without padding) and URL-encoded (path and form style)."""
    raw = value.encode()
    forms = {value, quote(value, safe=""), quote_plus(value)}
    for encoded in (base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()):
        forms |= {encoded, encoded.rstrip("=")}
    return {form for form in forms if len(form) >= MIN_REGISTERED_SECRET}


def register_secret(value: str) -> None:
    """Remember a resolved secret value (and its encoded forms) so that `redact` removes it
    wherever it appears."""
    if len(value) >= MIN_REGISTERED_SECRET:
        with _known_lock:
            _known.update(encoded_forms(value))


def basic_credentials(user: str, secret: str) -> str:
    """The base64 `user:secret` of an HTTP Basic header, registered as a secret itself."""
    pair = base64.b64encode(f"{user}:{secret}".encode()).decode()
    register_secret(pair)
    return pair


def _scrub(match: re.Match[str]) -> str:
    start, end = match.span("secret")
    whole = match.group(0)
    return whole[: start - match.start()] + REDACTED + whole[end - match.start():]


def redact(text: str) -> str:
    with _known_lock:
        known = sorted(_known, key=len, reverse=True)
    for value in known:
        if value in text:
            text = text.replace(value, REDACTED)
    for shape in _SECRET_SHAPES:
        text = shape.sub(_scrub, text)
    return _EMAIL.sub("[email]", text)


def looks_like_secret(value: str) -> bool:
    """True for a literal that holds a credential by the same shapes `redact` removes (configs
    must hold references instead); identifiers, keys and paths are not secrets."""
    return any(shape.search(value) for shape in _SECRET_SHAPES)


def contains_registered_secret(text: str) -> bool:
    with _known_lock:
        return any(value in text for value in _known)


# C0 controls but tab, newline and carriage return; DEL; lone surrogates (not UTF-8). A NUL
# or a surrogate cannot be stored in Postgres text; the others drive a terminal.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` with its control characters written as `\\uXXXX` escapes."""
    return CONTROL_CHARACTERS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def one_line(text: object, limit: int = 500) -> str:
    """`text` redacted, on one line, control characters escaped, at most `limit` characters
    ('' for None or empty)."""
    if text is None or text == "":
        return ""
    cleaned = printable(redact(" ".join(str(text).split())))
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


def describe_exception(exc: BaseException, limit: int = 500) -> str:
    return one_line(f"{type(exc).__name__}: {exc}", limit)
