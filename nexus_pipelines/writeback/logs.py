"""Structured run logs (docs/design/writeback-run.md, "Logs and secrets").

One JSON object per event with `event`, `job_name`, `run_id` and counts, durations
and error codes. Callers pass only those: never tokens, auth headers, payloads or
raw customer fields; external IDs go through `hashing.redact_id`. As a last guard,
string values pass the one redaction rule (`nexus_pipelines.redaction`: secrets,
tokens and email addresses removed, one line, bounded length) and keys that name
secrets or payloads are refused.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from nexus_pipelines.redaction import one_line

FORBIDDEN_KEYS = frozenset({"token", "access_token", "authorization", "client_secret", "client_id", "password",
                            "payload", "record", "records", "body", "headers"})


def render_event(event: str, **fields: Any) -> str:
    document: dict[str, Any] = {"event": event}
    for key, value in fields.items():
        if key.lower() in FORBIDDEN_KEYS:
            raise ValueError(f"log field {key!r} may carry secrets or customer data")
        document[key] = _clean(value)
    return json.dumps(document, sort_keys=True, default=str)


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return one_line(value, 300)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def log_event(logger: logging.Logger, event: str, *, level: int = logging.INFO, **fields: Any) -> None:
    logger.log(level, render_event(event, **fields))
