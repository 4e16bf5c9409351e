"""The one redaction rule: what may never leave a process in a log line, an exception, a
ledger column, a work-item summary or run metadata.

`redact` removes, in this order: every secret value this process resolved from a
reference (`register_secret`, called by `credentials.resolve`), credentials inside URLs,
Authorization headers and bearer/basic/token values, `key=value` / `"key": "value"`
pairs whose key names a secret, JWTs, long opaque strings that may be keys, and email
addresses (customer data in provider messages). `one_line` also folds whitespace, writes
control characters as escapes (a NUL cannot be stored in Postgres text) and bounds the
length, which is what every summary, error message and ledger column wants.
"""

from __future__ import annotations

import math
import re
import threading

REDACTED = "[redacted]"

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # credentials inside URLs: scheme://user:secret@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@"), r"\1[redacted]@"),
    # Authorization / PRIVATE-TOKEN style headers, then bearer/basic/token values anywhere
    (re.compile(r"(?i)\b((?:proxy-)?authorization\s*[:=]\s*)(\S+\s+)?\S+"), r"\1[redacted]"),
    (re.compile(r"(?i)\b(private-token\s*[:=]\s*)\S+"), r"\1[redacted]"),
    (re.compile(r"(?i)\b(bearer|basic)\s+[^\s\"',;]+"), r"\1 [redacted]"),
    (re.compile(r"(?i)\b(token)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 [redacted]"),
    # key=value / key: value pairs whose key looks secret (quoted with " or ', as in a dict repr)
    (
        re.compile(
            r"(?i)\b([a-z0-9_-]*(?:password|passwd|secret|token|api[_-]?key|apikey|access[_-]?key|"
            r"private[_-]?key|client[_-]?secret|session|cookie|signature|credential)[a-z0-9_-]*)"
            r"([\"']?\s*[:=]\s*[\"']?)([^\s\"',;&}]+)"
        ),
        r"\1\2[redacted]",
    ),
    # PEM blocks (private keys pasted into a message)
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|$)", re.S), REDACTED),
    # JWTs and long opaque strings (hex, base64) that may be keys
    (re.compile(r"\beyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*"), REDACTED),
    (re.compile(r"\b[A-Za-z0-9+/_-]{32,}={0,2}"), REDACTED),
    (re.compile(r"[\w.+-]+@[\w-]+(\.[\w-]+)+"), "[email]"),
)

_known: set[str] = set()
_known_lock = threading.Lock()
# Short values would redact ordinary words; references to such secrets are refused when
# they are resolved (see credentials.resolve).
MIN_REGISTERED_SECRET = 8


def register_secret(value: str) -> None:
    """Remember a resolved secret value so that `redact` removes it wherever it appears."""
    if len(value) >= MIN_REGISTERED_SECRET:
        with _known_lock:
            _known.add(value)


def redact(text: str) -> str:
    with _known_lock:
        known = sorted(_known, key=len, reverse=True)
    for value in known:
        if value in text:
            text = text.replace(value, REDACTED)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


_TOKEN_PREFIXES = re.compile(
    r"^(glpat-|gldt-|glrt-|glptt-|ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|xox[abpr]-|sk_live_|AKIA[0-9A-Z]{12})"
)
_OPAQUE = re.compile(r"^[A-Za-z0-9+/=_-]{24,}$")
# A random (version 4) UUID is how some providers name a container (a Jira site's cloud id):
# an identifier, not a credential.
_UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def looks_like_secret(value: str) -> bool:
    """True for a literal that is probably a credential: a known token prefix, a JWT, a PEM
    block, a URL with a password, or a long high-entropy opaque string (configs must hold
    references instead)."""
    value = value.strip()
    if _TOKEN_PREFIXES.match(value) or "PRIVATE KEY-----" in value or value.startswith("eyJ"):
        return True
    if re.search(r"://[^/\s:@]+:[^/\s@]+@", value):
        return True
    if _UUID4.match(value):
        return False
    if _OPAQUE.match(value) and re.search(r"\d", value) and re.search(r"[A-Za-z]", value):
        return _entropy_bits(value) >= 3.5
    return False


def _entropy_bits(value: str) -> float:
    counts = {c: value.count(c) for c in set(value)}
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())


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
