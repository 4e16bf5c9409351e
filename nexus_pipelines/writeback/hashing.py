"""The canonical payload hash (docs/design/writeback-run.md, "Mapping and the payload hash").

sha256(UTF8(JSON(sort_keys=true, normalized values))) over the target object, the
external ID field and value, and the owned payload. Run IDs, job timestamps and
OAuth metadata never enter it. Values must already be normalized by the mapper
(str, int, bool, None, Decimal; timestamps as UTC ISO-8601 strings); a float or
any other type is refused, so a binary float can never leak into the hash.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any


class HashInputError(TypeError):
    pass


def canonical_value(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise HashInputError("a decimal payload value must be finite")
        # Decimal text keeps the declared scale ("12.50" stays "12.50"): exact, no float.
        return format(value, "f")
    if isinstance(value, float):
        raise HashInputError("float payload values are not allowed; normalize to Decimal")
    raise HashInputError(f"payload values must be normalized scalars, got {type(value).__name__}")


def canonical_json(target_object: str, external_id_field: str, external_id: str, payload: Mapping[str, Any]) -> str:
    document = {
        "object": target_object,
        "external_id_field": external_id_field,
        "external_id": external_id,
        "payload": {key: canonical_value(value) for key, value in payload.items()},
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def payload_hash(target_object: str, external_id_field: str, external_id: str, payload: Mapping[str, Any]) -> str:
    text = canonical_json(target_object, external_id_field, external_id, payload)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _decimal_text(value: Any) -> str:
    if type(value) is Decimal:
        return canonical_value(value)
    raise HashInputError(f"payload values must be normalized scalars, got {type(value).__name__}")


# The C encoder json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False) runs,
# built once: JSONEncoder.encode builds it again on every call, which was a fifth of the
# validation pass's CPU per row. No circular-reference markers: the document is flat.
_STRING = json.encoder.encode_basestring  # what that encoder makes of a str
_ENCODE = json.encoder.c_make_encoder(None, _decimal_text, _STRING, None, ":", ",", True, False, True)


def canonical_payload_hash(target_object: str, external_id_field: str, external_id: str,
                           payload: Mapping[str, Any]) -> str:
    """`payload_hash` for a payload the mapper's contract check already bounded (str,
    bool, int, None, finite Decimal): the same bytes, without a second normalizing pass. The
    document's own keys are written in their sorted order, so only the payload is sorted."""
    text = (f'{{"external_id":{_STRING(external_id)},"external_id_field":{_STRING(external_id_field)},'
            f'"object":{_STRING(target_object)},"payload":{"".join(_ENCODE(payload, 0))}}}')
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def redact_id(external_id: str) -> str:
    """A short stable digest for logs, where an external ID may identify a customer."""
    return hashlib.sha256(external_id.encode("utf-8")).hexdigest()[:12]
