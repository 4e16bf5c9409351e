"""Postgres persistence of connector state: registration revisions, per-revision progress
with its fenced poll lease, and the page commit (docs/design/connector-contract.md, "The poll tick").

A poll claim takes one due revision of an active registration with `FOR UPDATE SKIP
LOCKED`, a fresh token from the shared `fencing_tokens` sequence and a lease deadline
from the database clock. `commit_page` writes one ingress receipt per delivered issue
version and the adapter's next cursor in one transaction that first re-checks the
token, so an expired or stale poller writes nothing. Failures are scheduled durably
(`record_failure`) under the same fence, separate from the in-request retries.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import psycopg
from psycopg import Connection, Cursor
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from nexus_pipelines.connectors.core.registration import Registration, RegistrationError, from_canonical
from nexus_pipelines.connectors.core.registry import ConnectorRegistry
from nexus_pipelines.connectors.provider_gate import GateReading, send_reading
from nexus_pipelines.redaction import one_line
from nexus_pipelines.workqueue.receipts import Delivery, ReceiptSource, admit_page, page_document, send_page

POLL_NAMESPACE = "issue-poll"
OBSERVE_ROUTE_KEY = "ticket.observe"


class PollLeaseLost(RuntimeError):
    """The poll claim's token is no longer current; nothing was written."""


class UnreadableRevision(RegistrationError):
    """A claimed revision's stored config no longer parses under this code (a schema or
    validation change): the caller records its failure under the claim's token."""

    def __init__(self, detail: str, *, tenant: str, key: str, revision_id: str, token: int, failure_count: int):
        super().__init__(detail)
        self.registration_id = f"{tenant}/{key}"
        self.tenant, self.key, self.revision_id = tenant, key, revision_id
        self.token, self.failure_count = token, failure_count


@dataclass(frozen=True)
class StoredRevision:
    registration: Registration
    revision_no: int
    status: str


@dataclass(frozen=True)
class PollClaim:
    registration: Registration
    revision_no: int
    owner: str
    token: int
    lease_until: datetime
    cursor: str | None
    failure_count: int


# -- registrations -------------------------------------------------------------------


def _lock_key(conn: Connection, tenant: str, key: str) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('connector-registration:' || %s, 0))",
                 (f"{tenant}/{key}",))


def register(conn: Connection, registration: Registration) -> StoredRevision:
    """Record a revision (idempotent by digest); a new digest gets the next revision number."""
    with conn.transaction():
        _lock_key(conn, registration.tenant, registration.key)
        row = conn.execute(
            """SELECT revision_no, status FROM connector_registrations
                WHERE tenant = %s AND registration_key = %s AND digest = %s""",
            (registration.tenant, registration.key, registration.digest),
        ).fetchone()
        if row is not None:
            return StoredRevision(registration, row[0], row[1])
        (revision_no,) = conn.execute(
            """INSERT INTO connector_registrations (tenant, registration_key, revision_id, revision_no, digest,
                                                    connector_kind, schema_id, project, config)
               SELECT %(tenant)s, %(key)s, %(revision_id)s, coalesce(max(revision_no), 0) + 1, %(digest)s,
                      %(kind)s, %(schema)s, %(project)s, %(config)s
                 FROM connector_registrations WHERE tenant = %(tenant)s AND registration_key = %(key)s
               RETURNING revision_no""",
            {
                "tenant": registration.tenant, "key": registration.key, "revision_id": registration.revision_id,
                "digest": registration.digest, "kind": registration.kind, "schema": registration.schema_id,
                "project": registration.project, "config": Jsonb(registration.canonical()),
            },
        ).fetchone()
        return StoredRevision(registration, revision_no, "registered")


def _stored(row: tuple, registry: ConnectorRegistry) -> StoredRevision:
    config, digest, revision_no, status = row
    registration = from_canonical(config, registry)
    if registration.digest != digest:
        raise RegistrationError(f"stored revision {registration.revision_id} no longer matches its digest")
    return StoredRevision(registration, revision_no, status)


_REVISION_COLUMNS = "config, digest, revision_no, status"


def revision_by_number(conn: Connection, registry: ConnectorRegistry, registration_id: str,
                       revision_no: int) -> StoredRevision | None:
    tenant, _, key = registration_id.partition("/")
    row = conn.execute(
        f"""SELECT {_REVISION_COLUMNS} FROM connector_registrations
             WHERE tenant = %s AND registration_key = %s AND revision_no = %s""",
        (tenant, key, revision_no),
    ).fetchone()
    return _stored(row, registry) if row else None


def revisions(conn: Connection, registry: ConnectorRegistry, registration_id: str) -> list[StoredRevision]:
    tenant, _, key = registration_id.partition("/")
    rows = conn.execute(
        f"""SELECT {_REVISION_COLUMNS} FROM connector_registrations
             WHERE tenant = %s AND registration_key = %s ORDER BY revision_no""",
        (tenant, key),
    ).fetchall()
    return [_stored(r, registry) for r in rows]


def set_status(conn: Connection, registration: Registration, status: str) -> None:
    stamp = {"active": "activated_at", "retired": "retired_at"}.get(status)
    conn.execute(
        f"""UPDATE connector_registrations SET status = %s{f', {stamp} = clock_timestamp()' if stamp else ''}
             WHERE tenant = %s AND registration_key = %s AND revision_id = %s""",
        (status, registration.tenant, registration.key, registration.revision_id),
    )


def ensure_progress(conn: Connection, registration: Registration) -> None:
    """A revision starts from no cursor, due at once; it never inherits another revision's cursor."""
    conn.execute(
        """INSERT INTO connector_progress (tenant, registration_key, revision_id) VALUES (%s, %s, %s)
           ON CONFLICT DO NOTHING""",
        (registration.tenant, registration.key, registration.revision_id),
    )


def poll_lease_held(conn: Connection, registration: Registration) -> bool:
    row = conn.execute(
        """SELECT lease_until > now() FROM connector_progress
            WHERE tenant = %s AND registration_key = %s AND revision_id = %s AND lease_until IS NOT NULL""",
        (registration.tenant, registration.key, registration.revision_id),
    ).fetchone()
    return bool(row and row[0])


# -- poll claims ----------------------------------------------------------------------

_DUE = "r.status = 'active' AND p.next_poll_at <= now() AND (p.lease_until IS NULL OR p.lease_until <= now())"
# whether a revision the claim could take, other than {this} (its key columns), is due
_OTHERS_DUE = f"""EXISTS (SELECT FROM connector_progress p
                   JOIN connector_registrations r USING (tenant, registration_key, revision_id)
                  WHERE {_DUE} {{only}} AND (p.tenant, p.registration_key, p.revision_id) <> ({{this}}))"""
_CLAIM = f"""
WITH due AS (
    SELECT p.tenant, p.registration_key, p.revision_id
      FROM connector_progress p
      JOIN connector_registrations r USING (tenant, registration_key, revision_id)
     WHERE {_DUE} {{only}} {{unless}}
     ORDER BY p.next_poll_at
     LIMIT 1
       FOR UPDATE OF p SKIP LOCKED
)
UPDATE connector_progress p
   SET lease_owner = %(owner)s, lease_token = nextval('fencing_tokens'), lease_until = now() + %(ttl)s,
       updated_at = now()
  FROM due, connector_registrations r
 WHERE (p.tenant, p.registration_key, p.revision_id) = (due.tenant, due.registration_key, due.revision_id)
   AND (r.tenant, r.registration_key, r.revision_id) = (due.tenant, due.registration_key, due.revision_id)
RETURNING r.config, r.digest, r.revision_no, r.status, p.lease_token, p.lease_until, p.cursor_token, p.failure_count,
          p.tenant, p.registration_key, p.revision_id
"""
# in a page's flight: no claim when the page's cursor update kept its revision's lease for the next tick
_UNLESS_KEPT = """AND NOT EXISTS (SELECT FROM connector_progress k
                    WHERE (k.tenant, k.registration_key, k.revision_id) = (%(tenant)s, %(key)s, %(rev)s)
                      AND k.lease_owner = %(owner)s AND k.lease_until > now())"""


@dataclass(frozen=True)
class ClaimRequest:
    """Who asks for the next due revision, for how long, among which registrations, and the
    registry its stored config is read with."""

    registry: ConnectorRegistry
    owner: str
    ttl: timedelta
    registration_ids: Sequence[str] | None = None


def claim_due(conn: Connection, registry: ConnectorRegistry, *, owner: str, ttl: timedelta,
              registration_ids: Sequence[str] | None = None) -> PollClaim | None:
    """Take the poll lease of one due revision of an active registration, or None.

    Raises UnreadableRevision, holding the lease, when the claimed revision cannot be read.
    """
    return claim(conn, ClaimRequest(registry, owner, ttl, registration_ids))


def claim(conn: Connection, request: ClaimRequest) -> PollClaim | None:
    """`claim_due` for a request."""
    return _claimed(_send_claim(conn, request).fetchone(), request)


def _only(request: ClaimRequest) -> str:
    return "AND (p.tenant || '/' || p.registration_key) = ANY(%(only)s::text[])" if request.registration_ids else ""


def _claim_params(request: ClaimRequest) -> dict:
    return {"owner": request.owner, "ttl": request.ttl, "only": list(request.registration_ids or [])}


def _send_claim(conn: Connection, request: ClaimRequest, unless_kept: Registration | None = None) -> Cursor:
    """The claim statement, sent; `unless_kept`: in that revision's page flight, it claims nothing
    when the page's cursor update kept the revision's lease."""
    if unless_kept is None:
        return conn.execute(_CLAIM.format(only=_only(request), unless=""), _claim_params(request))
    r = unless_kept
    return conn.execute(_CLAIM.format(only=_only(request), unless=_UNLESS_KEPT),
                        {**_claim_params(request), "tenant": r.tenant, "key": r.key, "rev": r.revision_id})


def _claimed(row: tuple | None, request: ClaimRequest) -> PollClaim | None:
    if row is None:
        return None
    try:
        stored = _stored(row[:4], request.registry)
    except RegistrationError as exc:
        raise UnreadableRevision(str(exc), tenant=row[8], key=row[9], revision_id=row[10], token=row[4],
                                 failure_count=row[7]) from None
    return PollClaim(stored.registration, stored.revision_no, request.owner, row[4], row[5], row[6], row[7])


_HOLD = """
SELECT 1 FROM connector_progress
 WHERE tenant = %s AND registration_key = %s AND revision_id = %s
   AND lease_token = %s AND lease_until > now()
   FOR UPDATE
"""


def _hold(conn: Connection, claim: PollClaim) -> None:
    r = claim.registration
    if conn.execute(_HOLD, (r.tenant, r.key, r.revision_id, claim.token)).fetchone() is None:
        raise PollLeaseLost(f"poll lease of {r.revision_id} is no longer held with token {claim.token}")


class IssueVersion(NamedTuple):  # a tuple: a page builds one per issue, and a tuple is the cheapest to build
    """One delivered issue version, as core admits it: the normalized issue and its digest, in
    the receipt body, held as its `canonical_json` (`canonical_body`, what is stored and hashed)."""

    external_ref: str
    updated_at: datetime
    digest: str
    canonical_body: str

    @property
    def body(self) -> dict:
        return json.loads(self.canonical_body)


@dataclass(frozen=True)
class PageCommit:
    """What a page commit wrote, and the claim it took for the next tick when asked to (None
    when nothing was due; an UnreadableRevision, holding its lease, when the revision it
    claimed cannot be read)."""

    admitted_refs: list[str]
    next_claim: PollClaim | UnreadableRevision | None = None


# the fence stops the transaction on the server (migration 0036), so the statements after it
# and the COMMIT go out in the same flight: a stale poller's receipts and next claim abort with it
# When the run goes on (`claims`), the scan goes on and no other revision the next claim could
# take is due, this revision would be that claim: the update keeps its lease under a fresh token
# instead of releasing it for the claim to take again (one row update a page, not two).
_ADVANCE = f"""
WITH keeps AS (
    SELECT %(claims)s AND NOT %(exhausted)s
           AND EXISTS (SELECT FROM connector_registrations
                        WHERE (tenant, registration_key, revision_id) = (%(tenant)s, %(key)s, %(rev)s)
                          AND status = 'active')
           AND NOT {_OTHERS_DUE.format(only="{only}", this="%(tenant)s, %(key)s, %(rev)s")} AS keeps
), advanced AS (
    UPDATE connector_progress
       SET cursor_token = %(cursor)s, exhausted = %(exhausted)s,
           next_poll_at = CASE WHEN %(exhausted)s THEN now() + make_interval(secs => %(interval)s) ELSE now() END,
           lease_owner = CASE WHEN keeps THEN %(owner)s END,
           lease_token = CASE WHEN keeps THEN nextval('fencing_tokens') ELSE lease_token END,
           lease_until = CASE WHEN keeps THEN now() + %(ttl)s END,
           failure_count = 0, last_success_at = now(),
           throttled_until = NULL, pages = pages + 1, issues_delivered = issues_delivered + %(n)s, updated_at = now()
      FROM keeps
     WHERE tenant = %(tenant)s AND registration_key = %(key)s AND revision_id = %(rev)s
       AND lease_token = %(token)s AND lease_until > now()
 RETURNING keeps, lease_token, lease_until
)
SELECT coalesce((SELECT true FROM advanced), connector_poll_lease_lost(%(lost)s)),
       (SELECT keeps FROM advanced), (SELECT lease_token FROM advanced), (SELECT lease_until FROM advanced)
"""
LEASE_LOST_SQLSTATE = "NXL01"


def _advance_params(then_claim: ClaimRequest | None) -> tuple[str, dict]:
    """The cursor update's scope clause and claim parameters (none when the run stops here)."""
    if then_claim is None:
        return "", {"claims": False, "owner": None, "ttl": timedelta(0), "only": []}
    return _only(then_claim), {"claims": True, **_claim_params(then_claim)}


def commit_page(conn: Connection, claim: PollClaim, versions: Sequence[IssueVersion], *, next_cursor: str,
                exhausted: bool, then_claim: ClaimRequest | None = None,
                in_flight: Callable[[GateReading], None] | None = None) -> PageCommit:
    """Admit one receipt per issue version and advance the cursor, atomically and fenced.

    `admitted_refs` are the external refs whose version was new (an unchanged re-poll admits
    none). With `then_claim`, the next tick's claim (the same statement `claim_due` runs, unless
    the cursor update kept this revision's lease because it is that claim) is taken in the same
    transaction, so a walk of many pages costs one commit per page, not two.
    Raises PollLeaseLost, writing nothing, when the claim is no longer current. `conn` is an
    autocommit connection outside a transaction: the commit is its own. `in_flight` runs once the
    flight, COMMIT included, is sent and before its answer is read, so its work overlaps the
    server's commit (not at all when a failure already came back while it was sent); it must
    not raise (the transaction may already be committed). It is given the provider gates as a
    statement of the flight read them, after its BEGIN (`provider_gate.admitted_by`).
    """
    r = claim.registration
    by_delivery = {_delivery_id(v): v for v in versions}
    deliveries = _deliveries(claim, by_delivery.items())
    lost = f"poll lease of {r.revision_id} is no longer held with token {claim.token}"
    if conn.info.transaction_status != TransactionStatus.IDLE:  # its COMMIT would end the caller's transaction
        raise RuntimeError("commit_page runs its own transaction: call it outside one")
    try:
        # one flight and one Sync, BEGIN to COMMIT (`conn.transaction()` would sync at BEGIN and at
        # COMMIT); the results are read once the flight is answered
        with conn.pipeline():
            conn.execute("BEGIN")
            gates = _send_gates_read(conn) if in_flight is not None else None
            document = page_document(_source(claim, POLL_NAMESPACE), deliveries)
            # answered while the document was built, and read before anything else is sent: what
            # follows may wait for a lock, the gates' answer never does
            reading = GateReading.of(gates.fetchall()) if gates is not None else None
            # the fenced cursor update first: it locks the progress row, so it is also the hold
            only, params = _advance_params(then_claim)
            advance = conn.execute(_ADVANCE.format(only=only), {
                **params, "cursor": next_cursor, "exhausted": exhausted, "interval": r.poll_interval_seconds,
                "n": len(versions), "tenant": r.tenant, "key": r.key, "rev": r.revision_id, "token": claim.token,
                "lost": lost})
            next_claim = _send_claim(conn, then_claim, unless_kept=r) if then_claim is not None else None
            admitted = send_page(conn, document)
            conn.execute("COMMIT")
            if in_flight is not None:
                in_flight(reading)
    except BaseException as exc:
        if conn.info.transaction_status != TransactionStatus.IDLE:
            conn.rollback()  # the flight's transaction did not commit: none of it is written
        if isinstance(exc, psycopg.Error) and exc.sqlstate == LEASE_LOST_SQLSTATE:
            raise PollLeaseLost(lost) from None
        raise
    refs = [by_delivery[d].external_ref for (d,) in admitted.fetchall()] if admitted is not None else []
    _, kept, token, lease_until = advance.fetchone()
    if kept:  # no other revision was due: the next claim is this revision at the stored cursor
        return PageCommit(refs, PollClaim(r, claim.revision_no, then_claim.owner, token, lease_until, next_cursor,
                                          failure_count=0))
    try:
        return PageCommit(refs, _claimed(next_claim.fetchone() if next_claim is not None else None, then_claim))
    except UnreadableRevision as unreadable:  # read after the commit: the page stays written
        return PageCommit(refs, unreadable)


def _send_gates_read(conn: Connection) -> Cursor:
    """The provider gates' reading, sent with a flush request: the server answers it at once,
    not at the flight's Sync."""
    gates = send_reading(conn)
    conn.pgconn.send_flush_request()
    conn.pgconn.flush()
    return gates


def _source(claim: PollClaim, namespace: str) -> ReceiptSource:
    return ReceiptSource(registration_id=claim.registration.registration_id, revision=claim.revision_no,
                         namespace=namespace, route_key=OBSERVE_ROUTE_KEY, event_kind="issue_version")


def _deliveries(claim: PollClaim, pairs: Iterable[tuple[str, IssueVersion]]) -> list[Delivery]:
    """The delivery of each (delivery id, version)."""
    revision_id = claim.registration.revision_id
    return [Delivery(d, v.updated_at, {"external_ref": v.external_ref, "revision_id": revision_id}, v.canonical_body)
            for d, v in pairs]


def _delivery_id(version: IssueVersion) -> str:
    """One delivery per issue version: its ref, provider update time and digest."""
    return f"{version.external_ref}@{version.updated_at.isoformat()}#{version.digest.removeprefix('sha256:')[:16]}"


def record_failure(conn: Connection, claim: PollClaim, *, failure_class: str, reason: str, detail: str,
                   delay_s: float, throttled_s: float | None = None) -> None:
    """Count the failure and schedule the next poll `delay_s` from now; the cursor stays put.
    `throttled_s` is the provider's stated wait, kept for a manual poll (`request_poll`)."""
    r = claim.registration
    with conn.transaction():
        _hold(conn, claim)
        _schedule_failure(conn, r.tenant, r.key, r.revision_id, claim.token, failure_class, reason, detail, delay_s,
                          throttled_s)


def record_unreadable(conn: Connection, unreadable: UnreadableRevision, *, delay_s: float) -> bool:
    """Record a terminal failure for a claimed revision that cannot be read; False when its
    lease was lost meanwhile (nothing written)."""
    u = unreadable
    with conn.transaction():
        return _schedule_failure(conn, u.tenant, u.key, u.revision_id, u.token, "terminal", "registration_unreadable",
                                 str(u), delay_s)


def _schedule_failure(conn: Connection, tenant: str, key: str, revision_id: str, token: int, failure_class: str,
                      reason: str, detail: str, delay_s: float, throttled_s: float | None = None) -> bool:
    return conn.execute(
        """UPDATE connector_progress
              SET failure_count = failure_count + 1, last_failure_class = %(cls)s, last_failure_reason = %(reason)s,
                  last_failure_detail = %(detail)s, last_failure_at = now(),
                  next_poll_at = now() + make_interval(secs => %(delay)s),
                  throttled_until = now() + make_interval(secs => %(throttled)s::float8),
                  lease_owner = NULL, lease_until = NULL, updated_at = now()
            WHERE tenant = %(tenant)s AND registration_key = %(key)s AND revision_id = %(rev)s
              AND lease_token = %(token)s AND lease_until > now()""",
        {"cls": failure_class, "reason": reason, "detail": one_line(detail, 300), "delay": max(delay_s, 0.0),
         "throttled": None if throttled_s is None else max(throttled_s, 0.0),
         "tenant": tenant, "key": key, "rev": revision_id, "token": token},
    ).rowcount == 1


def release(conn: Connection, claim: PollClaim | UnreadableRevision) -> bool:
    """Give the poll lease back unchanged (the run stopped before fetching)."""
    if isinstance(claim, PollClaim):
        r = claim.registration
        tenant, key, revision_id = r.tenant, r.key, r.revision_id
    else:
        tenant, key, revision_id = claim.tenant, claim.key, claim.revision_id
    return conn.execute(
        """UPDATE connector_progress SET lease_owner = NULL, lease_until = NULL, updated_at = now()
            WHERE tenant = %s AND registration_key = %s AND revision_id = %s AND lease_token = %s""",
        (tenant, key, revision_id, claim.token),
    ).rowcount == 1


@dataclass(frozen=True)
class ProgressView:
    registration_id: str
    revision_id: str
    revision_no: int
    kind: str
    status: str
    cursor: str | None
    exhausted: bool
    next_poll_at: datetime
    leased: bool
    failure_count: int
    last_failure: str | None
    last_success_at: datetime | None
    pages: int
    issues_delivered: int


def progress(conn: Connection, registration_ids: Sequence[str] | None = None) -> list[ProgressView]:
    only = "WHERE (r.tenant || '/' || r.registration_key) = ANY(%s::text[])" if registration_ids else ""
    rows = conn.execute(
        f"""SELECT r.tenant || '/' || r.registration_key, r.revision_id, r.revision_no, r.connector_kind, r.status,
                   p.cursor_token, coalesce(p.exhausted, false), coalesce(p.next_poll_at, now()),
                   coalesce(p.lease_until > now(), false), coalesce(p.failure_count, 0),
                   CASE WHEN p.last_failure_reason IS NOT NULL
                        THEN p.last_failure_reason || ': ' || coalesce(p.last_failure_detail, '') END,
                   p.last_success_at, coalesce(p.pages, 0), coalesce(p.issues_delivered, 0)
              FROM connector_registrations r
              LEFT JOIN connector_progress p USING (tenant, registration_key, revision_id)
              {only}
             ORDER BY 1, r.revision_no""",
        (list(registration_ids),) if registration_ids else (),
    ).fetchall()
    return [ProgressView(*row) for row in rows]


def due_registrations(conn: Connection, limit: int = 1000) -> list[tuple[str, str, int]]:
    """(registration id, revision id, revision no) of active revisions due for a poll: the sensor's probe."""
    return conn.execute(
        f"""SELECT p.tenant || '/' || p.registration_key, p.revision_id, r.revision_no
             FROM connector_progress p
             JOIN connector_registrations r USING (tenant, registration_key, revision_id)
            WHERE {_DUE}
            ORDER BY p.next_poll_at LIMIT %s""",
        (limit,),
    ).fetchall()


@dataclass(frozen=True)
class PollRequest:
    """One revision a manual poll made due: now, or at the provider's wait a throttled poll
    learned (`held_until`, with the failure that named it), never earlier."""

    registration_id: str
    revision_id: str
    held_until: datetime | None
    held_by: str | None

    def line(self) -> str:
        until = self.held_until.astimezone(UTC)
        return (f"{self.registration_id}: keeps the provider's wait until {until:%Y-%m-%dT%H:%M:%SZ} "
                f"({self.held_by}); its schedule polls then")


def request_poll(conn: Connection, registration_ids: Sequence[str] | None = None) -> list[PollRequest]:
    """Make active revisions due now (a manual poll), except that a provider's known wait is
    kept; a held lease is left alone."""
    only = "AND (p.tenant || '/' || p.registration_key) = ANY(%s::text[])" if registration_ids else ""
    rows = conn.execute(
        f"""UPDATE connector_progress p
               SET next_poll_at = greatest(now(), coalesce(p.throttled_until, now())), updated_at = now()
              FROM connector_registrations r
             WHERE (r.tenant, r.registration_key, r.revision_id) = (p.tenant, p.registration_key, p.revision_id)
               AND r.status = 'active' {only}
         RETURNING p.tenant || '/' || p.registration_key, p.revision_id,
                   CASE WHEN p.throttled_until > now() THEN p.throttled_until END,
                   CASE WHEN p.throttled_until > now() THEN p.last_failure_reason || ': ' || p.last_failure_detail END""",
        (list(registration_ids),) if registration_ids else (),
    ).fetchall()
    return [PollRequest(*row) for row in rows]


# -- a claim taken on demand (the reconciliation sweep) -------------------------------

_CLAIM_NOW = """
UPDATE connector_progress p
   SET lease_owner = %(owner)s, lease_token = nextval('fencing_tokens'), lease_until = now() + %(ttl)s,
       updated_at = now()
  FROM connector_registrations r
 WHERE (r.tenant, r.registration_key, r.revision_id) = (p.tenant, p.registration_key, p.revision_id)
   AND r.status = 'active' AND p.tenant = %(tenant)s AND p.registration_key = %(key)s
   AND (p.lease_until IS NULL OR p.lease_until <= now())
RETURNING r.config, r.digest, r.revision_no, r.status, p.lease_token, p.lease_until, p.cursor_token, p.failure_count
"""


def claim_now(conn: Connection, registry: ConnectorRegistry, registration_id: str, *, owner: str,
              ttl: timedelta) -> PollClaim | None:
    """Take the poll lease of a registration's active revision whether or not a poll is due;
    None while a poll holds it (or no revision is active). Its schedule and cursor stay as
    they are: give it back with `release`."""
    tenant, _, key = registration_id.partition("/")
    row = conn.execute(_CLAIM_NOW, {"owner": owner, "ttl": ttl, "tenant": tenant, "key": key}).fetchone()
    if row is None:
        return None
    stored = _stored(row[:4], registry)
    return PollClaim(stored.registration, stored.revision_no, owner, row[4], row[5], row[6], row[7])


def admit_versions(conn: Connection, claim: PollClaim, versions: Sequence[IssueVersion], *,
                   namespace: str) -> list[str]:
    """Admit one receipt per issue version under the claim's fence, in the caller's transaction,
    without touching the cursor; returns the refs whose receipt was new. Raises PollLeaseLost."""
    _hold(conn, claim)
    # its own delivery ids: a version whose poll receipt exists but whose observation was lost is admitted again
    pairs = [(f"{namespace}:{_delivery_id(v)}", v) for v in versions]
    admitted = admit_page(conn, _source(claim, namespace), _deliveries(claim, pairs))
    by_delivery = {d: v.external_ref for d, v in pairs}
    return [by_delivery[d] for d in admitted]
