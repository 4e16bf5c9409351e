"""The SOQL the NexusCRM simulator answers on `GET /services/data/vXX.X/query?q=...`: one
shape, `SELECT <fields> FROM <object> WHERE <field> IN ('<value>', ...)`, as Salesforce
runs it (the writeback reads created records back by external id with it).

As Salesforce documents: anything else is 400 MALFORMED_QUERY; an unknown object is
INVALID_TYPE and an unknown field INVALID_FIELD; string literals take the escapes
`\\' \\" \\\\ \\n \\r \\t \\b \\f` and no others; at most 2,000 records come back per page, the
rest behind `nextRecordsUrl` (`/query/<locator>-<offset>`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

QUERY_PAGE_SIZE = 2000

_SOQL = re.compile(
    r"^\s*SELECT\s+(?P<fields>\w+(?:\s*,\s*\w+)*)\s+FROM\s+(?P<object>\w+)\s+WHERE\s+(?P<key>\w+)\s+IN\s*"
    r"\((?P<values>.*)\)\s*$", re.IGNORECASE | re.DOTALL)
_LITERAL = re.compile(r"\s*'((?:[^'\\]|\\.)*)'\s*(?:,|$)", re.DOTALL)
_ESCAPES = {"'": "'", '"': '"', "\\": "\\", "n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f"}


class MalformedQuery(ValueError):
    """The SOQL is not the one shape the simulator runs (MALFORMED_QUERY)."""


@dataclass(frozen=True)
class InQuery:
    fields: tuple[str, ...]
    object_name: str
    key: str
    values: tuple[str, ...]


def parse_in_query(soql: str) -> InQuery:
    match = _SOQL.match(soql)
    if match is None:
        raise MalformedQuery("unexpected token: only SELECT <fields> FROM <object> WHERE <field> IN (...) is simulated")
    text, values, position = match["values"], [], 0
    while position < len(text):
        literal = _LITERAL.match(text, position)
        if literal is None or literal.end() == position:
            raise MalformedQuery(f"unexpected token at character {position} of the IN list")
        values.append(_unescape(literal.group(1)))
        position = literal.end()
    if not values or text.rstrip().endswith(","):
        raise MalformedQuery("the IN list needs at least one value and no trailing comma")
    fields = tuple(f.strip() for f in match["fields"].split(","))
    return InQuery(fields, match["object"], match["key"], tuple(values))


def _unescape(body: str) -> str:
    out, chars = [], iter(body)
    for char in chars:
        if char == "\\":
            escaped = next(chars)
            if escaped not in _ESCAPES:
                raise MalformedQuery(f"invalid escape sequence \\{escaped} in a string literal")
            char = _ESCAPES[escaped]
        out.append(char)
    return "".join(out)
