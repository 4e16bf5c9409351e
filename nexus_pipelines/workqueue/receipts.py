"""Ingress receipts: admission, routing under a fenced claim, idempotent materialization.

A receipt row is the durable inbox of one verified provider delivery and the only
owner of its routing state. A router claims due receipts in a batch (compare-and-swap
with a token from `workqueue_tokens` and a lease deadline from the database clock;
a claim counts as a routing attempt, so a receipt whose router keeps dying still
reaches the terminal 'failed' status), resolves each through an explicit route table,
and materializes the batch in one transaction of set-based statements: the receipts
still held with the router's token are locked first (each by its own token; one whose
lease was lost writes nothing), events are inserted with
`ON CONFLICT (registration_id, idempotency_key) DO NOTHING`, work items with
`ON CONFLICT (event_id, work_type) DO NOTHING`, and the receipts are marked materialized
under the same fences. A stale router's receipt therefore writes nothing; a retried
router or a duplicate delivery creates nothing twice. A receipt whose route fails is
recorded on that receipt alone: a route that raises before any write, and a receipt whose
rows a statement refuses by materializing the batch again one receipt at a time.

The executable state goes to the claim path that owns the generation: work items for
a WorkItem-owned generation (or one not activated yet), Event executions for an
Event-owned one (the generation row is locked like a claim locks it, so a gate
changing the owner waits). A logical work (event, work type) that already has a row
on either path gets none on the other.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from psycopg import Connection, Cursor
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from nexus_pipelines.workqueue.retry import DEFAULT_POLICY, RetryPolicy, summarize_exception
from nexus_pipelines.workqueue.claims import WALK_MAX
from nexus_pipelines.workqueue.states import CLAIMABLE, EVENT_PATH, WORK_ITEM_PATH, sql_in

BODY_SNAPSHOT_LIMIT = 256 * 1024


class LeaseLostError(RuntimeError):
    """The caller's token no longer holds the row; nothing was written."""


class RoutingRejected(Exception):
    """A permanent routing failure: the receipt goes straight to 'failed'."""


class UnknownRoute(Exception):
    """No route for the receipt's route key (retried: the route may not be deployed yet)."""


# one encoder for every call: json.dumps builds a new one per call when given options
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


def canonical_json(body: Any) -> str:
    return _CANONICAL.encode(body)


def canonical_json_with(body: Mapping[str, Any], **canonical: str) -> str:
    """`canonical_json` of `body` plus the entries of `canonical`, each already its value's
    `canonical_json`: spliced in as it is instead of serialized again."""
    parts = {key: canonical_json(value) for key, value in body.items()} | canonical
    return "{" + ",".join(f"{json.dumps(key)}:{parts[key]}" for key in sorted(parts)) + "}"


def check_snapshot(canonical: str) -> None:
    """A body snapshot is bounded: a larger body is stored elsewhere and passed by reference."""
    if len(canonical) > BODY_SNAPSHOT_LIMIT:
        raise ValueError(f"body snapshot exceeds {BODY_SNAPSHOT_LIMIT} bytes; store it and pass body_ref")


def payload_hash(body: Any, canonical: str | None = None) -> str:
    """The body's hash; `canonical` is its `canonical_json` when the caller has it already."""
    text = canonical_json(body) if canonical is None else canonical
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class ReceiptIn(BaseModel):
    """A verified provider delivery, as the ingress route hands it over."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    registration_id: str = Field(min_length=1)
    revision: int = Field(ge=0)
    namespace: str = Field(min_length=1)
    delivery_id: str = Field(min_length=1)
    route_key: str = Field(min_length=1)
    received_at: datetime
    http_method: str = "POST"
    content_type: str | None = None
    event_kind: str | None = None
    correlation: dict[str, str] = Field(default_factory=dict)
    body: dict[str, Any] | list[Any] | None = None
    body_ref: str | None = None
    admission_result: str = "verified"
    max_routing_attempts: int = Field(default=5, ge=1)
    _canonical: tuple[Any, str] | None = PrivateAttr(default=None)  # (the body, its canonical_json)

    @model_validator(mode="after")
    def _body_present(self) -> ReceiptIn:
        if self.body is None and self.body_ref is None:
            raise ValueError("a receipt needs a body snapshot or a body reference")
        if self.body is not None:
            check_snapshot(self.canonical_body)
        return self

    @property
    def canonical_body(self) -> str | None:
        """The body snapshot's `canonical_json`: serialized once, for the size check, the
        stored snapshot and its hash (again only for a copy given another body)."""
        if self.body is None:
            return None
        if self._canonical is None or self._canonical[0] is not self.body:
            self._canonical = (self.body, canonical_json(self.body))
        return self._canonical[1]


@dataclass(frozen=True)
class AdmitResult:
    receipt_id: int
    created: bool


_ADMIT = """
INSERT INTO ingress_receipts (registration_id, revision, namespace, delivery_id, http_method, route_key,
                              content_type, event_kind, received_at, admission_result, correlation, body,
                              body_ref, payload_hash, max_routing_attempts)
VALUES (%(registration_id)s, %(revision)s, %(namespace)s, %(delivery_id)s, %(http_method)s, %(route_key)s,
        %(content_type)s, %(event_kind)s, %(received_at)s, %(admission_result)s, %(correlation)s, %(body)s,
        %(body_ref)s, %(payload_hash)s, %(max_routing_attempts)s)
ON CONFLICT (registration_id, namespace, delivery_id) DO NOTHING
RETURNING receipt_id
"""


def admit_receipt(conn: Connection, receipt: ReceiptIn) -> AdmitResult:
    """Durably accept a delivery; a redelivery of the same delivery id returns the first receipt."""
    data = receipt.model_dump()
    data["correlation"] = Jsonb(receipt.correlation)
    data["body"] = Jsonb(receipt.body) if receipt.body is not None else None
    data["payload_hash"] = payload_hash(receipt.body if receipt.body is not None else receipt.body_ref)
    row = conn.execute(_ADMIT, data).fetchone()
    if row is not None:
        return AdmitResult(row[0], True)
    (existing,) = conn.execute(
        "SELECT receipt_id FROM ingress_receipts WHERE registration_id = %s AND namespace = %s AND delivery_id = %s",
        (receipt.registration_id, receipt.namespace, receipt.delivery_id),
    ).fetchone()
    return AdmitResult(existing, False)


# One JSON document per page: psycopg's text-array dumping escapes every element in Python,
# which cost more than the insert itself for pages of issue bodies. Each body is serialized
# once (its canonical form, also hashed) and spliced into the document as it is.
_ADMIT_MANY = """
INSERT INTO ingress_receipts (registration_id, revision, namespace, delivery_id, route_key, event_kind,
                              received_at, correlation, body, payload_hash, max_routing_attempts)
SELECT d.registration_id, d.revision, d.namespace, d.delivery_id, d.route_key, d.event_kind, d.received_at,
       d.correlation, d.body, d.payload_hash, d.max_attempts
  FROM ROWS FROM (jsonb_to_recordset(%(rows)s::jsonb)
       AS (registration_id text, revision int, namespace text, delivery_id text, route_key text, event_kind text,
           received_at timestamptz, correlation jsonb, body jsonb, payload_hash text, max_attempts int))
       WITH ORDINALITY AS d
 ORDER BY d.ordinality
ON CONFLICT (registration_id, namespace, delivery_id) DO NOTHING
RETURNING delivery_id
"""


def admit_receipts(conn: Connection, receipts: Sequence[ReceiptIn]) -> list[str]:
    """Admit many deliveries with a body snapshot in one statement; returns the delivery ids that were new.

    Redeliveries (same registration, namespace and delivery id) are skipped, as in
    `admit_receipt`; a poll page of unchanged issues therefore writes nothing.
    """
    if not receipts:
        return []
    if any(r.body is None for r in receipts):
        raise ValueError("admit_receipts takes body snapshots only; use admit_receipt for body references")
    strings = _Strings()
    return [row[0] for row in send_page(conn, json_array([_row(_shared(r), r.delivery_id, r.received_at,
                                                                 r.correlation, r.canonical_body, strings)
                                                            for r in receipts]))]


class ReceiptSource(BaseModel):
    """What the receipts of one page of deliveries share (one source, revision, namespace and
    route), validated once for the page."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    registration_id: str = Field(min_length=1)
    revision: int = Field(ge=0)
    namespace: str = Field(min_length=1)
    route_key: str = Field(min_length=1)
    event_kind: str | None = None
    max_routing_attempts: int = Field(default=5, ge=1)


class Delivery(NamedTuple):  # a tuple: a page builds one per delivery, and a tuple is the cheapest to build
    """One delivery of a page: its id, time, correlation and its body snapshot's `canonical_json`."""

    delivery_id: str
    received_at: datetime
    correlation: Mapping[str, str]
    canonical_body: str


def admit_page(conn: Connection, source: ReceiptSource, deliveries: Sequence[Delivery]) -> list[str]:
    """`admit_receipts` for deliveries of one source: their shared fields are validated and
    serialized once, and each body arrives serialized (a page builds no model per delivery)."""
    sent = send_page(conn, page_document(source, deliveries))
    return [row[0] for row in sent] if sent is not None else []


def page_document(source: ReceiptSource, deliveries: Sequence[Delivery]) -> str | None:
    """`admit_page`'s rows as the one JSON document its statement takes (None for no deliveries),
    built apart from the sending: a flight builds it while a statement sent before is answered."""
    for d in deliveries:
        if not d.delivery_id:
            raise ValueError("a delivery needs a delivery id")
        check_snapshot(d.canonical_body)
    if not deliveries:
        return None
    shared, strings = _shared(source), _Strings()
    return json_array([_row(shared, d.delivery_id, d.received_at, d.correlation, d.canonical_body, strings)
                      for d in deliveries])


def send_page(conn: Connection, document: str | None) -> Cursor | None:
    """`admit_page`'s statement for a `page_document`, sent: the new delivery ids are read from the
    cursor it returns (None for no document), in a pipeline once its flight is answered."""
    return conn.execute(_ADMIT_MANY, {"rows": document}) if document is not None else None


def _shared(r: ReceiptIn | ReceiptSource) -> str:
    """The opening of a row's JSON object: the fields a source's receipts share."""
    return json.dumps({"registration_id": r.registration_id, "revision": r.revision, "namespace": r.namespace,
                       "route_key": r.route_key, "event_kind": r.event_kind,
                       "max_attempts": r.max_routing_attempts})[:-1]


class _Strings(dict):
    """The JSON of each distinct string of a document's rows, encoded once: the correlation's
    keys, and what a page's deliveries share there (their revision), come again on every row."""

    def __missing__(self, text: str) -> str:
        self[text] = encoded = _encode(text)
        return encoded


_encode = json.encoder.encode_basestring_ascii  # what json.dumps makes of a str


def _row(shared: str, delivery_id: str, received_at: datetime, correlation: Mapping[str, str], body: str,
         strings: _Strings) -> str:
    """One row of the admit document; the body's canonical form is spliced in as it is (and hashed)."""
    fields = ",".join([f"{strings[key]}:{strings[value]}" for key, value in correlation.items()])
    return (f'{shared},"delivery_id":{_encode(delivery_id)},"received_at":"{received_at.isoformat()}",'
            f'"correlation":{{{fields}}},"payload_hash":"{payload_hash(None, body)}","body":{body}}}')


def json_array(rows: Iterable[str]) -> str:
    """The JSON array of values that are each already JSON text (a statement's one document)."""
    return "[" + ",".join(rows) + "]"


# --- materialization specs -------------------------------------------------------------


@dataclass(frozen=True)
class WorkSpec:
    work_type: str
    queue_class: str = "default"
    source_lane_key: str | None = None
    target_lane_key: str | None = None
    max_attempts: int = DEFAULT_POLICY.max_attempts
    priority: int = 0


class _ReceiptBody:
    """The payload of an event that is its receipt's body snapshot as stored (`RECEIPT_BODY`)."""

    def __repr__(self) -> str:
        return "RECEIPT_BODY"


# An event payload that is the receipt's own body: the events statement copies the stored body
# and its hash from the receipt row, so a route that passes a body on never parses or
# serializes it (a receipt that holds its body by reference cannot be routed so).
RECEIPT_BODY = _ReceiptBody()


@dataclass(frozen=True)
class EventSpec:
    source_kind: str
    source_id: str
    idempotency_key: str
    work: Sequence[WorkSpec]
    payload: Any = None
    parse_outcome: str = "parsed"
    companion: Any = None
    correlation: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ClaimedReceipt:
    receipt_id: int
    token: int
    registration_id: str
    revision: int
    namespace: str
    delivery_id: str
    route_key: str
    event_kind: str | None
    body_json: str | None  # the body snapshot's JSON text as the database returns it
    body_ref: str | None
    payload_hash: str
    correlation: Mapping[str, str]
    attempts: int
    max_attempts: int
    lease_until: datetime

    @property
    def body(self) -> Any:
        """The body snapshot, parsed from `body_json` on each access (None for a body reference)."""
        return None if self.body_json is None else json.loads(self.body_json)


@dataclass(frozen=True)
class Route:
    """One route of a registration: `materialize` turns a receipt into event specs."""

    route_id: str
    version: int
    materialize: Callable[[ClaimedReceipt], Sequence[EventSpec]]


RouteTable = Mapping[str, Route]  # route_key -> Route (an explicit registry)


# The rows `due` locks are updated by primary key: this statement holds their locks, so their
# status is the one `due` selected (re-testing it would let the planner join by scanning every
# due receipt through the due index, which stale statistics say holds a row or two).
_CLAIM_RECEIPTS = """
WITH due AS (
    SELECT receipt_id, router_token
      FROM ingress_receipts
     WHERE routing_status IN ('pending', 'routing') AND next_attempt_at <= now()
     ORDER BY next_attempt_at, receipt_id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE ingress_receipts r
   SET routing_status = CASE WHEN r.routing_attempts >= r.max_routing_attempts THEN 'failed' ELSE 'routing' END,
       routing_error_class = CASE WHEN r.routing_attempts >= r.max_routing_attempts
                                  THEN 'attempts_exhausted' ELSE r.routing_error_class END,
       routing_error = CASE WHEN r.routing_attempts >= r.max_routing_attempts
                            THEN format('gave up after %%s routing attempts', r.routing_attempts)
                            ELSE r.routing_error END,
       routing_attempts = CASE WHEN r.routing_attempts >= r.max_routing_attempts
                               THEN r.routing_attempts ELSE r.routing_attempts + 1 END,
       router_owner = CASE WHEN r.routing_attempts >= r.max_routing_attempts THEN NULL ELSE %(owner)s END,
       router_token = CASE WHEN r.routing_attempts >= r.max_routing_attempts
                           THEN r.router_token ELSE nextval('workqueue_tokens') END,
       router_lease_until = CASE WHEN r.routing_attempts >= r.max_routing_attempts
                                 THEN NULL ELSE now() + %(ttl)s END,
       next_attempt_at = now() + %(ttl)s,
       updated_at = now()
  FROM due
 WHERE r.receipt_id = due.receipt_id
   AND r.router_token IS NOT DISTINCT FROM due.router_token
RETURNING r.receipt_id, r.router_token, r.registration_id, r.revision, r.namespace, r.delivery_id, r.route_key,
          r.event_kind, r.body::text, r.body_ref, r.payload_hash, r.correlation, r.routing_attempts,
          r.max_routing_attempts, r.router_lease_until, r.routing_status
"""


def claim_receipts(conn: Connection, *, owner: str, limit: int, lease_ttl: timedelta) -> list[ClaimedReceipt]:
    """Claim due receipts (new, retry-due, or whose router lease expired).

    The due receipts are taken in the due index's order, stopping at `limit`: without
    statistics, a bitmap scan that fetches and sorts every due receipt looks cheaper, and
    routing a backlog of N would read N rows for each batch."""
    with conn.transaction():
        conn.execute("SET LOCAL enable_bitmapscan = off")
        rows = conn.execute(_CLAIM_RECEIPTS, {"owner": owner, "limit": limit, "ttl": lease_ttl}).fetchall()
    return [
        ClaimedReceipt(
            receipt_id=r[0], token=r[1], registration_id=r[2], revision=r[3], namespace=r[4], delivery_id=r[5],
            route_key=r[6], event_kind=r[7], body_json=r[8], body_ref=r[9], payload_hash=r[10], correlation=r[11],
            attempts=r[12], max_attempts=r[13], lease_until=r[14],
        )
        for r in rows
        if r[15] == "routing"
    ]


def _owners(conn: Connection, generations: set[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """The claim path of each (registration, revision); the rows are locked like a claim locks them."""
    rows = conn.execute(
        """SELECT registration_id, revision, claim_path FROM workqueue_generations
            WHERE (registration_id, revision) IN (SELECT * FROM unnest(%b::text[], %b::int[]))
            ORDER BY registration_id, revision FOR KEY SHARE""",
        ([g[0] for g in generations], [g[1] for g in generations]),
    ).fetchall()
    found = {(r[0], r[1]): r[2] for r in rows}
    return {g: found.get(g, WORK_ITEM_PATH) for g in generations}


# Array parameters go in binary (`%b`) here and in claims.py: psycopg writes a text array
# element by element in Python with a quoting test (about 1.2 us an element), a binary one
# at about a quarter of that.
_WORK_ROWS = """
WITH d AS (
    SELECT * FROM unnest(%(events)b::bigint[], %(regs)b::text[], %(revs)b::int[], %(types)b::text[],
                         %(classes)b::text[], %(max)b::int[], %(prio)b::smallint[], %(src)b::text[], %(tgt)b::text[])
           WITH ORDINALITY AS d(event_id, registration_id, revision, work_type, queue_class, max_attempts, priority,
                                source_lane, target_lane, ord)
),
new AS (
    SELECT d.* FROM d
     WHERE NOT EXISTS (SELECT 1 FROM {other} o WHERE o.event_id = d.event_id AND o.work_type = d.work_type)
){lanes}
INSERT INTO {table} (event_id, registration_id, revision, work_type, queue_class, max_attempts,
                     source_lane_key, target_lane_key{columns})
SELECT d.event_id, d.registration_id, d.revision, d.work_type, d.queue_class, d.max_attempts,
       d.source_lane, d.target_lane{values}
  FROM {rows} d
 ORDER BY d.ord
ON CONFLICT (event_id, work_type) DO NOTHING
"""

# A target lane's claimable items beyond the first WALK_MAX unparked ones (those queued, then
# the batch's in order) are inserted parked: more than a claim's walk visits, they would fill
# walks at the front of the claim order, and the claims would park them anyway, each with an
# update and its index entries (see "Parking" in claims.py). Concurrent enqueues may each
# count the same queued ones and leave more unparked: the claims park those as before.
# The queued count is taken on the first new row of each lane and spread over the lane's rows
# by a window, with no join: joined as a per-lane table, the generic plan of the prepared
# statement, once an autoanalyze had taken the work items' statistics before the other tables',
# counted the lane again for every row of the batch (a bulk enqueue of 100,000 items took
# minutes for each 5,000 instead of half a second).
_INSERT_WORK_ITEMS = _WORK_ROWS.format(
    table="connector_work_items", other="event_executions",
    lanes=f""",
lanes AS (
    SELECT n.*, CASE WHEN n.first_of_lane THEN (SELECT count(*) FROM (
               SELECT 1 FROM connector_work_items e
                WHERE e.registration_id = n.registration_id AND e.target_lane_key = n.target_lane
                  AND e.target_lane_key IS NOT NULL AND e.state IN {sql_in(CLAIMABLE)} AND NOT e.parked AND NOT e.behind
                LIMIT {WALK_MAX}) queued) END AS unparked
      FROM (SELECT new.*, new.target_lane IS NOT NULL AND row_number() OVER (
                   PARTITION BY new.registration_id, new.target_lane ORDER BY new.ord) = 1 AS first_of_lane
              FROM new) n
)""",
    rows="lanes",
    columns=", priority, parked",
    values=f""", d.priority,
       coalesce(max(d.unparked) OVER (PARTITION BY d.registration_id, d.target_lane)
                + count(*) OVER (PARTITION BY d.registration_id, d.target_lane ORDER BY d.ord) > {WALK_MAX}, false)""",
)
_INSERT_EXECUTIONS = _WORK_ROWS.format(
    table="event_executions", other="connector_work_items", lanes="", rows="new", columns="", values="",
)

# One JSON document for the batch's events, for the reason `_ADMIT_MANY` gives: each payload
# is serialized once (its canonical form, also hashed) and spliced in as it is, and a
# `RECEIPT_BODY` payload is the receipt's stored body and hash (one primary-key probe each;
# the receipts are locked by this transaction).
_INSERT_EVENTS = """
INSERT INTO connector_outbox_events (receipt_id, registration_id, revision, route_id, route_version, source_kind,
                                     source_id, idempotency_key, delivery_seq, payload_hash, payload, parse_outcome,
                                     companion, correlation)
SELECT d.receipt_id, d.registration_id, d.revision, d.route_id, d.route_version, d.source_kind, d.source_id,
       d.idempotency_key, d.seq, coalesce(d.payload_hash, b.payload_hash), CASE WHEN d.from_receipt THEN b.body
       ELSE d.payload END, d.parse_outcome, d.companion, d.correlation
  FROM ROWS FROM (jsonb_to_recordset(%(rows)s::jsonb)
       AS (receipt_id bigint, registration_id text, revision int, route_id text, route_version int, source_kind text,
           source_id text, idempotency_key text, seq int, payload_hash text, payload jsonb, from_receipt boolean,
           parse_outcome text, companion jsonb, correlation jsonb))
       WITH ORDINALITY AS d
  LEFT JOIN LATERAL (SELECT r.body, r.payload_hash FROM ingress_receipts r
                      WHERE d.from_receipt AND r.receipt_id = d.receipt_id) b ON true
 ORDER BY d.ordinality
ON CONFLICT (registration_id, idempotency_key) DO NOTHING
"""

_EVENT_IDS = """
SELECT e.event_id
  FROM unnest(%b::text[], %b::text[]) WITH ORDINALITY AS d(registration_id, idempotency_key, ord)
  JOIN connector_outbox_events e USING (registration_id, idempotency_key)
 ORDER BY d.ord
"""


@dataclass(frozen=True)
class PlannedReceipt:
    """What one receipt materializes: its events under one route, checked before any write."""

    receipt_id: int
    registration_id: str
    revision: int
    route_id: str
    route_version: int
    events: Sequence[EventSpec]
    # each event's row of the events document, serialized when the receipt is planned (a value
    # JSON cannot hold fails the plan), so a pipelined router's writer only sends them
    event_rows: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        keys = [e.idempotency_key for e in self.events]
        if len(set(keys)) != len(keys):
            raise RoutingRejected("a receipt materialized two events with the same idempotency key")
        object.__setattr__(self, "event_rows", tuple(_event_rows(self)))


def _stored_json(value: Any) -> str:
    """The canonical form of a value that is stored, strictly: a value JSON cannot hold fails its
    receipt's route (TypeError) instead of being stored as its str(), as the hash's form allows."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _event_rows(p: PlannedReceipt) -> Iterable[str]:
    for seq, e in enumerate(p.events):
        from_receipt = e.payload is RECEIPT_BODY
        payload = "null" if from_receipt else _stored_json(e.payload)
        companion = "null" if e.companion is None else _stored_json(e.companion)
        fields = json.dumps({
            "receipt_id": p.receipt_id, "registration_id": p.registration_id, "revision": p.revision,
            "route_id": p.route_id, "route_version": p.route_version, "source_kind": e.source_kind,
            "source_id": e.source_id, "idempotency_key": e.idempotency_key, "seq": seq,
            "payload_hash": None if from_receipt else payload_hash(e.payload, payload), "from_receipt": from_receipt,
            "parse_outcome": e.parse_outcome, "correlation": dict(e.correlation)})
        yield f'{fields[:-1]},"payload":{payload},"companion":{companion}}}'


def _event_document(planned: Sequence[PlannedReceipt]) -> str:
    return json_array(row for p in planned for row in p.event_rows)


def _insert_events_and_work(conn: Connection, planned: Sequence[PlannedReceipt]) -> tuple[list[list[int]], dict[str, int]]:
    """Insert the receipts' events and their work idempotently, in a few statements for the whole
    batch; returns each receipt's event ids in spec order and how much work was created on each
    claim path (work items, Event executions)."""
    created = {WORK_ITEM_PATH: 0, EVENT_PATH: 0}
    events = [(p, e) for p in planned for e in p.events]
    if not events:
        return [[] for _ in planned], created
    conn.execute(_INSERT_EVENTS, {"rows": _event_document(planned)})
    ids = [r[0] for r in conn.execute(
        _EVENT_IDS, ([p.registration_id for p, _ in events], [e.idempotency_key for _, e in events]))]
    event_ids, at = [], 0
    for p in planned:
        event_ids.append(ids[at:at + len(p.events)])
        at += len(p.events)
    work_rows = [(event_id, p, w) for event_id, (p, e) in zip(ids, events) for w in e.work]
    if not work_rows:
        return event_ids, created
    owners = _owners(conn, {(p.registration_id, p.revision) for _, p, _ in work_rows})
    for path, sql in ((WORK_ITEM_PATH, _INSERT_WORK_ITEMS), (EVENT_PATH, _INSERT_EXECUTIONS)):
        rows = [r for r in work_rows if owners[(r[1].registration_id, r[1].revision)] == path]
        if rows:
            created[path] = conn.execute(sql, {
                "events": [r[0] for r in rows], "regs": [r[1].registration_id for r in rows],
                "revs": [r[1].revision for r in rows], "types": [r[2].work_type for r in rows],
                "classes": [r[2].queue_class for r in rows], "max": [r[2].max_attempts for r in rows],
                "prio": [r[2].priority for r in rows], "src": [r[2].source_lane_key for r in rows],
                "tgt": [r[2].target_lane_key for r in rows],
            }).rowcount
    return event_ids, created


# One primary-key probe per held receipt, in receipt_id order (the ids come sorted). As a
# plain join, statistics taken after a poll (every receipt pending, none routing) costed the
# table at one routing row: the plan scanned all of it and compared it with every id.
_HOLD_RECEIPTS = """
SELECT r.receipt_id
  FROM unnest(%b::bigint[], %b::bigint[]) AS h(receipt_id, token)
 CROSS JOIN LATERAL (
    SELECT r.receipt_id FROM ingress_receipts r
     WHERE r.receipt_id = h.receipt_id AND r.router_token = h.token
       AND r.routing_status = 'routing' AND r.router_lease_until > now()
       FOR UPDATE) r
"""

# Each receipt's event ids travel as one array literal beside its id and token, so the
# statement joins the held rows one to one (aggregating a flat list of event ids by receipt
# planned as a nested loop over the whole batch for every row).
_MARK_MATERIALIZED = """
UPDATE ingress_receipts r
   SET routing_status = 'materialized', enqueued_event_ids = h.event_ids::bigint[], materialized_at = now(),
       router_lease_until = NULL, routing_error_class = NULL, routing_error = NULL, updated_at = now()
  FROM unnest(%(receipts)b::bigint[], %(tokens)b::bigint[], %(event_ids)b::text[]) AS h(receipt_id, token, event_ids)
 WHERE r.receipt_id = h.receipt_id AND r.router_token = h.token
"""


def hold_receipts(conn: Connection, claimed: Sequence[ClaimedReceipt]) -> set[int]:
    """The ids of the receipts still held with their tokens, each row locked until the caller's
    transaction ends; a receipt not returned is lost to the caller."""
    fences = sorted((c.receipt_id, c.token) for c in claimed)
    return {r[0] for r in conn.execute(_HOLD_RECEIPTS, ([f[0] for f in fences], [f[1] for f in fences]))}


class Materialized(NamedTuple):
    events: dict[int, list[int]]  # each materialized receipt's event ids
    work_items: int = 0  # work items created (on the WorkItem path)


def materialize_batch(conn: Connection, batch: Sequence[tuple[ClaimedReceipt, PlannedReceipt]]) -> Materialized:
    """Write events and work items for claimed receipts and mark them materialized, in one transaction.

    Each receipt is fenced by its own token: the receipts still held are locked first, and a
    receipt that is not (its lease ran out, another router took it) writes nothing and is
    missing from the result's events, which map each materialized receipt id to its event ids.
    """
    with conn.transaction():
        held = hold_receipts(conn, [c for c, _ in batch])
        kept = [(c, p) for c, p in batch if c.receipt_id in held]
        if not kept:
            return Materialized({})
        event_ids, created = _insert_events_and_work(conn, [p for _, p in kept])
        conn.execute(_MARK_MATERIALIZED, {
            "receipts": [c.receipt_id for c, _ in kept], "tokens": [c.token for c, _ in kept],
            "event_ids": ["{" + ",".join(map(str, ids)) + "}" for ids in event_ids],
        })
    return Materialized({c.receipt_id: ids for (c, _), ids in zip(kept, event_ids)}, created[WORK_ITEM_PATH])


def plan(receipt: ClaimedReceipt, routes: RouteTable) -> PlannedReceipt:
    """Resolve a claimed receipt through the route table (raises what `route_receipts` records)."""
    route = routes.get(receipt.route_key)
    if route is None:
        raise UnknownRoute(f"no route for route key {receipt.route_key!r}")
    return _planned(receipt, route, list(route.materialize(receipt)))


def _planned(receipt: ClaimedReceipt, route: Route, events: Sequence[EventSpec]) -> PlannedReceipt:
    if receipt.body_json is None and any(e.payload is RECEIPT_BODY for e in events):
        raise RoutingRejected("the route passes the receipt's body on, but the receipt holds its body by reference")
    return PlannedReceipt(receipt.receipt_id, receipt.registration_id, receipt.revision, route.route_id,
                          route.version, events)


def materialize(conn: Connection, receipt: ClaimedReceipt, route: Route, events: Sequence[EventSpec]) -> list[int]:
    """`materialize_batch` for one receipt; raises LeaseLostError (and writes nothing) when the
    receipt is no longer held with `receipt.token`."""
    done = materialize_batch(conn, [(receipt, _planned(receipt, route, events))]).events
    if receipt.receipt_id not in done:
        raise LeaseLostError(f"receipt {receipt.receipt_id} is no longer held with token {receipt.token}")
    return done[receipt.receipt_id]


def record_routing_failure(
    conn: Connection, receipt: ClaimedReceipt, exc: BaseException, *, terminal: bool, delay_s: float
) -> str | None:
    """Retry later (or fail terminally) under the router's fence; returns the new status, None when lost."""
    row = conn.execute(
        """UPDATE ingress_receipts
              SET routing_status = CASE WHEN %(terminal)s OR routing_attempts >= max_routing_attempts
                                        THEN 'failed' ELSE 'pending' END,
                  next_attempt_at = now() + make_interval(secs => %(delay)s),
                  router_lease_until = NULL, router_owner = NULL,
                  routing_error_class = %(cls)s, routing_error = %(summary)s, updated_at = now()
            WHERE receipt_id = %(id)s AND router_token = %(token)s AND routing_status = 'routing'
        RETURNING routing_status""",
        {
            "terminal": terminal,
            "delay": max(delay_s, 0.0),
            "cls": type(exc).__name__,
            "summary": summarize_exception(exc),
            "id": receipt.receipt_id,
            "token": receipt.token,
        },
    ).fetchone()
    return row[0] if row else None


@dataclass
class RouterReport:
    claimed: int = 0
    materialized: int = 0
    events: int = 0
    work_items: int = 0  # created on the WorkItem path
    retried: int = 0
    failed: int = 0
    lost: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)

    def add(self, other: RouterReport) -> None:
        """Count another batch's report in (its `claimed` too)."""
        for key, value in other.as_dict().items():
            setattr(self, key, getattr(self, key) + value)


def route_receipts(
    conn: Connection,
    routes: RouteTable,
    *,
    owner: str,
    limit: int = 50,
    lease_ttl: timedelta = timedelta(seconds=60),
    policy: RetryPolicy = DEFAULT_POLICY,
) -> RouterReport:
    """Claim one batch of due receipts and route it; failures are recorded on their receipt, never raised.

    Each receipt is planned on its own (a route that raises is recorded on that receipt
    alone), then the batch is materialized in one transaction. Should that transaction fail
    (a row some statement refuses), its receipts are materialized one at a time, so the
    failure is recorded on the receipt that caused it and the others still commit.
    """
    batch = _claim_and_plan(conn, routes, owner=owner, limit=limit, lease_ttl=lease_ttl, policy=policy)
    return batch.materialize(conn)


def route_until_idle(
    pool: ConnectionPool,
    routes: RouteTable,
    *,
    owner: str,
    batch: int = 500,
    max_receipts: int | None = None,
    time_budget_s: float | None = None,
    lease_ttl: timedelta = timedelta(seconds=60),
    policy: RetryPolicy = DEFAULT_POLICY,
) -> RouterReport:
    """Route batches of due receipts (as `route_receipts` does) until none is due, `max_receipts`
    were claimed or the time budget is spent; returns the batches' report summed.

    The next batch is claimed and planned on one connection while the last one is
    materialized on another, so the router's own work (reading bodies, planning and
    serializing events) runs while the database writes. A batch is materialized only once
    the one before it committed, so events and work items are created in claim order. A run that
    created more work items than the table's statistics know of analyzes it before it returns
    (`_refresh_outgrown_statistics`)."""
    total, claimed = RouterReport(), 0
    deadline = None if time_budget_s is None else time.monotonic() + time_budget_s
    with pool.connection() as claimer, pool.connection() as writer, \
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="router-writer") as materializer:
        writing = None
        while (max_receipts is None or claimed < max_receipts) and (deadline is None or time.monotonic() < deadline):
            limit = batch if max_receipts is None else min(batch, max_receipts - claimed)
            planned = _claim_and_plan(claimer, routes, owner=owner, limit=limit, lease_ttl=lease_ttl, policy=policy)
            if writing is not None:
                total.add(writing.result())
            writing = materializer.submit(planned.materialize, writer) if planned.report.claimed else None
            if writing is None:
                total.add(planned.report)
                break
            claimed += planned.report.claimed
        if writing is not None:
            total.add(writing.result())
        if total.work_items:
            _refresh_outgrown_statistics(writer, total.work_items)
    return total


# Statistics taken while the table was empty make the planner cost it at a row or two,
# whatever it holds now, and the claim's lane probes then tie between indexes: one tie
# reads the registration's whole backlog in every probe of every claim (a first sync of 10,000
# Jira issues drained at a sixth of its speed). PostgreSQL advises ANALYZE after a bulk load;
# autovacuum would analyze too, but up to a naptime later, while the drains already run.
_OUTGROWN = "SELECT reltuples < %s FROM pg_class WHERE oid = 'connector_work_items'::regclass"


def _refresh_outgrown_statistics(conn: Connection, created: int) -> None:
    """Analyze the work items when `created` new ones outnumber the rows its statistics count
    (never analyzed counts as none); one catalog read otherwise."""
    (outgrown,) = conn.execute(_OUTGROWN, (created,)).fetchone()
    if outgrown:
        conn.execute("ANALYZE connector_work_items")


@dataclass
class _PlannedBatch:
    """One claimed batch: the receipts planned, and its report (so far: how many were claimed and
    what became of those that failed planning)."""

    planned: list[tuple[ClaimedReceipt, PlannedReceipt]]
    report: RouterReport
    policy: RetryPolicy

    def fail(self, conn: Connection, receipt: ClaimedReceipt, exc: Exception) -> None:
        status = record_routing_failure(
            conn, receipt, exc, terminal=isinstance(exc, RoutingRejected), delay_s=self.policy.delay(receipt.attempts)
        )
        if status is None:
            self.report.lost += 1
        elif status == "failed":
            self.report.failed += 1
        else:
            self.report.retried += 1

    def materialize(self, conn: Connection) -> RouterReport:
        """Materialize the planned receipts (one at a time if the batch's transaction fails); the
        batch's whole report, `claimed` included."""
        failed: set[int] = set()
        try:
            done = [materialize_batch(conn, self.planned)] if self.planned else []
        except Exception:  # noqa: BLE001 - some receipt's rows broke the batch: find which, one at a time
            done = []
            for one in self.planned:
                try:
                    done.append(materialize_batch(conn, [one]))
                except Exception as exc:  # noqa: BLE001
                    failed.add(one[0].receipt_id)
                    self.fail(conn, one[0], exc)
        self.report.work_items += sum(m.work_items for m in done)
        events = {receipt_id: ids for m in done for receipt_id, ids in m.events.items()}
        for receipt, _ in self.planned:
            if receipt.receipt_id in events:
                self.report.materialized += 1
                self.report.events += len(events[receipt.receipt_id])
            elif receipt.receipt_id not in failed:
                self.report.lost += 1
        return self.report


def _claim_and_plan(
    conn: Connection, routes: RouteTable, *, owner: str, limit: int, lease_ttl: timedelta, policy: RetryPolicy
) -> _PlannedBatch:
    claimed = claim_receipts(conn, owner=owner, limit=limit, lease_ttl=lease_ttl)
    batch = _PlannedBatch([], RouterReport(claimed=len(claimed)), policy)
    for receipt in claimed:
        try:
            batch.planned.append((receipt, plan(receipt, routes)))
        except Exception as exc:  # noqa: BLE001 - every routing failure is recorded on the receipt
            batch.fail(conn, receipt, exc)
    return batch


# --- bulk enqueue (tests, benchmarks, backfills) -----------------------------------------


@dataclass(frozen=True, slots=True)
class NewWork:
    """One event with one work item, for `enqueue_work_items`."""

    idempotency_key: str
    work_type: str
    queue_class: str = "default"
    source_lane_key: str | None = None
    target_lane_key: str | None = None
    payload: Any = None
    max_attempts: int = DEFAULT_POLICY.max_attempts
    source_kind: str = "bulk"


def enqueue_work_items(
    conn: Connection,
    items: Iterable[NewWork],
    *,
    registration_id: str,
    revision: int,
    route_id: str = "bulk",
    route_version: int = 1,
    chunk: int = 5000,
) -> int:
    """Enqueue items through one materialized receipt per chunk; returns work items created.

    Goes through events, so `(event_id, work_type)` and the event idempotency key hold:
    enqueuing the same idempotency keys again creates nothing.
    """
    created = 0
    batch: list[NewWork] = []

    def flush() -> None:
        nonlocal created
        if not batch:
            return
        with conn.transaction():
            (receipt_id,) = conn.execute(
                """INSERT INTO ingress_receipts (registration_id, revision, namespace, delivery_id, route_key,
                                                 received_at, body_ref, payload_hash, routing_status,
                                                 materialized_at)
                   VALUES (%s, %s, 'bulk', %s, %s, now(), 'bulk-enqueue', 'sha256:bulk', 'materialized', now())
                   RETURNING receipt_id""",
                (registration_id, revision, uuid.uuid4().hex, route_id),
            ).fetchone()
            _, made = _insert_events_and_work(conn, [PlannedReceipt(
                receipt_id, registration_id, revision, route_id, route_version,
                [
                    EventSpec(
                        source_kind=i.source_kind,
                        source_id=i.idempotency_key,
                        idempotency_key=i.idempotency_key,
                        payload=i.payload,
                        work=[WorkSpec(i.work_type, i.queue_class, i.source_lane_key, i.target_lane_key,
                                       i.max_attempts)],
                    )
                    for i in batch
                ],
            )])
            created += sum(made.values())
            conn.execute(
                "UPDATE ingress_receipts SET enqueued_event_ids = ARRAY(SELECT event_id FROM connector_outbox_events"
                " WHERE receipt_id = %s ORDER BY event_id) WHERE receipt_id = %s",
                (receipt_id, receipt_id),
            )
        batch.clear()

    for item in items:
        batch.append(item)
        if len(batch) >= chunk:
            flush()
    flush()
    return created
