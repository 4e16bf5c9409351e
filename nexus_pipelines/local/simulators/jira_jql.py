"""The JQL the Jira simulator understands: a strict subset of Jira's grammar, refused with
Jira's own kind of 400 for anything else.

    clause [AND clause]... [ORDER BY field [ASC|DESC][, field [ASC|DESC]]...]
    clause: project = <id|key> | issuetype = <id> | updated|created <op> "<date>"

Dates take Jira's absolute formats (`yyyy/MM/dd HH:mm`, `yyyy-MM-dd HH:mm`,
`yyyy/MM/dd`, `yyyy-MM-dd`; no seconds: the granularity is the minute) and mean a wall
time in the searching account's profile time zone. A query without any clause is
unbounded, which the enhanced search refuses; this subset also needs a project clause.
ORDER BY takes at most 7 fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

DATE_FORMATS = ("%Y/%m/%d %H:%M", "%Y-%m-%d %H:%M", "%Y/%m/%d", "%Y-%m-%d")
ORDER_FIELDS = ("updated", "created", "id", "key")
MAX_ORDER_FIELDS = 7
_TOKEN = re.compile(r'\s*(?:(>=|<=|!=|=|>|<|,)|"((?:[^"\\]|\\.)*)"|\'((?:[^\'\\]|\\.)*)\'|([^\s=<>!,"\']+))')
_DATE_ERROR = ("Date value '{value}' for field '{name}' is invalid. Valid formats include: 'yyyy/MM/dd HH:mm', "
               "'yyyy-MM-dd HH:mm', 'yyyy/MM/dd', 'yyyy-MM-dd', or a period format e.g. '-5d', '4w 2d'.")


class JqlError(ValueError):
    """A JQL the simulator refuses; the message is what the 400's errorMessages carry."""


@dataclass(frozen=True)
class Bound:
    name: str  # updated | created
    op: str
    wall: datetime  # naive: a wall time in the account's zone


@dataclass
class Query:
    project: str | None = None
    issuetype: str | None = None
    bounds: list[Bound] = field(default_factory=list)
    order: list[tuple[str, bool]] = field(default_factory=list)  # (field, descending)


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise JqlError(f"Error in the JQL Query: the character '{text[pos:].strip()[0]}' is a reserved JQL "
                           f"character. You must enclose it in a string or use the escape '\\u' (char {pos + 1}).")
        op, double, single, word = match.groups()
        if op:
            out.append(("op", op))
        elif word is not None:
            out.append(("word", word))
        else:
            out.append(("str", double if double is not None else single))
        pos = match.end()
    return out


def _date(name: str, value: str) -> datetime:
    for form in DATE_FORMATS:
        try:
            return datetime.strptime(value, form)
        except ValueError:
            continue
    raise JqlError(_DATE_ERROR.format(value=value, name=name))


def parse(text: str) -> Query:
    tokens = _tokens(text)
    query, n = Query(), 0

    def take(kind: str | None = None) -> str:
        nonlocal n
        if n >= len(tokens) or (kind is not None and tokens[n][0] != kind):
            raise JqlError("Error in the JQL Query: Expecting either a value, list or function but got "
                           f"'{tokens[n][1] if n < len(tokens) else 'end of query'}'.")
        n += 1
        return tokens[n - 1][1]

    def word(expected: str) -> bool:
        return n < len(tokens) and tokens[n][0] == "word" and tokens[n][1].lower() == expected

    while n < len(tokens) and not word("order"):
        if query.project is not None or query.issuetype is not None or query.bounds:
            if not word("and"):
                raise JqlError(f"Error in the JQL Query: Expecting 'AND' or 'ORDER BY' but got '{tokens[n][1]}'.")
            take()
        name, op = take("word").lower(), take("op")
        value = tokens[n][1] if n < len(tokens) and tokens[n][0] in ("str", "word") else take("str")
        n += 1
        if name in ("updated", "created") and op in (">=", ">", "<=", "<"):
            query.bounds.append(Bound(name, op, _date(name, value)))
        elif name in ("project", "issuetype") and op == "=":
            setattr(query, name, value)
        else:
            raise JqlError(f"Field '{name}' with operator '{op}' is not supported by this search.")
    if word("order"):
        take()
        if not word("by"):
            raise JqlError("Error in the JQL Query: Expecting 'BY' after 'ORDER'.")
        take()
        while True:
            name = take("word").lower()
            if name not in ORDER_FIELDS:
                raise JqlError(f"Not able to sort using field '{name}'.")
            descending = False
            if word("asc") or word("desc"):
                descending = take().lower() == "desc"
            query.order.append((name, descending))
            if n < len(tokens) and tokens[n] == ("op", ","):
                take()
                continue
            break
    if n != len(tokens):
        raise JqlError(f"Error in the JQL Query: Expecting end of query but got '{tokens[n][1]}'.")
    if query.project is None and query.issuetype is None and not query.bounds:
        raise JqlError("Unbounded JQL queries are not allowed here. Please add a search restriction to your query.")
    if query.project is None:  # bounded for Jira, but this simulator holds projects, not a whole site's index
        raise JqlError("The simulator answers only queries restricted to one project (project = <id or key>).")
    if len(query.order) > MAX_ORDER_FIELDS:
        raise JqlError(f"The ORDER BY clause can contain at most {MAX_ORDER_FIELDS} fields.")
    return query
