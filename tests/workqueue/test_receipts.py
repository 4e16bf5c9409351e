from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest

from nexus_pipelines.control.db import connect
from nexus_pipelines.workqueue.receipts import (
    RECEIPT_BODY,
    EventSpec,
    LeaseLostError,
    ReceiptIn,
    Route,
    RoutingRejected,
    WorkSpec,
    admit_receipt,
    claim_receipts,
    materialize,
    route_receipts,
)
from nexus_pipelines.workqueue.retry import RetryPolicy

NOW = datetime(2026, 11, 29, tzinfo=timezone.utc)
FAST = RetryPolicy(base_s=0, cap_s=0, jitter=0)


def receipt(reg: str, delivery: str, *, key: str | None = None, route_key: str = "issues", **kw) -> ReceiptIn:
    body = {"issue": key or delivery, "action": "updated"}
    return ReceiptIn(
        registration_id=reg, revision=1, namespace="tracker", delivery_id=delivery, route_key=route_key,
        received_at=NOW, body=body, correlation={"request_id": f"rq-{delivery}"}, **kw,
    )


def issue_events(r) -> list[EventSpec]:
    issue = r.body["issue"]
    return [
        EventSpec(
            source_kind="issue", source_id=issue, idempotency_key=f"issue:{issue}:{r.body['action']}",
            payload=r.body,
            work=[
                WorkSpec("ticket.observe", source_lane_key=f"issue:{issue}", target_lane_key=f"ticket:{issue}"),
                WorkSpec("audit.note", queue_class="bulk"),
            ],
        )
    ]


ROUTES = {"issues": Route("issues", 3, issue_events)}


def counts(conn, reg):
    return conn.execute(
        """SELECT (SELECT count(*) FROM connector_outbox_events WHERE registration_id = %(r)s),
                  (SELECT count(*) FROM connector_work_items WHERE registration_id = %(r)s)""",
        {"r": reg},
    ).fetchone()


def test_admit_is_idempotent_per_delivery(control_conn, reg):
    first = admit_receipt(control_conn, receipt(reg, "d1"))
    again = admit_receipt(control_conn, receipt(reg, "d1"))
    assert first.created and not again.created and again.receipt_id == first.receipt_id


def test_receipt_without_body_is_refused():
    with pytest.raises(ValueError, match="body"):
        ReceiptIn(registration_id="r", revision=1, namespace="n", delivery_id="d", route_key="k", received_at=NOW)


def test_routing_materializes_events_and_work_items_in_one_go(control_conn, reg):
    rid = admit_receipt(control_conn, receipt(reg, "d1")).receipt_id
    report = route_receipts(control_conn, ROUTES, owner="router-1", limit=10)
    assert report.materialized >= 1
    assert counts(control_conn, reg) == (1, 2)
    status, event_ids, token = control_conn.execute(
        "SELECT routing_status, enqueued_event_ids, router_token FROM ingress_receipts WHERE receipt_id = %s", (rid,)
    ).fetchone()
    assert status == "materialized" and len(event_ids) == 1 and token is not None
    route_id, version, receipt_id = control_conn.execute(
        "SELECT route_id, route_version, receipt_id FROM connector_outbox_events WHERE event_id = %s", (event_ids[0],)
    ).fetchone()
    assert (route_id, version, receipt_id) == ("issues", 3, rid)


def test_duplicate_receipts_and_router_retries_create_nothing_twice(control_conn, reg):
    admit_receipt(control_conn, receipt(reg, "d1", key="I-1"))
    admit_receipt(control_conn, receipt(reg, "d1", key="I-1"))  # redelivery: same receipt
    admit_receipt(control_conn, receipt(reg, "d2", key="I-1"))  # new delivery of the same logical event
    route_receipts(control_conn, ROUTES, owner="r1", limit=10)
    assert counts(control_conn, reg) == (1, 2)
    statuses = control_conn.execute(
        "SELECT routing_status, enqueued_event_ids FROM ingress_receipts WHERE registration_id = %s ORDER BY receipt_id",
        (reg,),
    ).fetchall()
    assert [s for s, _ in statuses] == ["materialized", "materialized"]
    assert statuses[0][1] == statuses[1][1]  # both point at the one event
    # a router retry of an already materialized spec (same keys) creates nothing either
    admit_receipt(control_conn, receipt(reg, "d3", key="I-1"))
    route_receipts(control_conn, ROUTES, owner="r2", limit=10)
    assert counts(control_conn, reg) == (1, 2)


def test_stale_router_writes_nothing_and_the_receipt_survives_a_router_crash(control_conn, control_dsn, reg):
    admit_receipt(control_conn, receipt(reg, "d1"))
    # router 1 claims, then "crashes" (its lease runs out)
    (stale,) = [r for r in claim_receipts(control_conn, owner="r1", limit=100, lease_ttl=timedelta(milliseconds=100)) if r.registration_id == reg]
    control_conn.execute("SELECT pg_sleep(0.2)")
    # after a restart a new router (new connection) picks the receipt up again
    with connect(control_dsn) as fresh:
        report = route_receipts(fresh, ROUTES, owner="r2", limit=100)
    assert report.materialized >= 1
    # the stale router wakes up and tries to materialize: rejected, nothing written
    with pytest.raises(LeaseLostError):
        materialize(control_conn, stale, ROUTES["issues"], issue_events(stale))
    assert counts(control_conn, reg) == (1, 2)
    attempts = control_conn.execute(
        "SELECT routing_attempts FROM ingress_receipts WHERE registration_id = %s", (reg,)
    ).fetchone()[0]
    assert attempts == 2


def test_concurrent_routers_materialize_each_receipt_once(control_dsn, reg):
    with connect(control_dsn) as conn:
        for i in range(40):
            admit_receipt(conn, receipt(reg, f"d{i}", key=f"I-{i % 25}"))
    errors: list[BaseException] = []

    def router(n: int) -> None:
        try:
            with connect(control_dsn) as conn:
                for _ in range(50):
                    if route_receipts(conn, ROUTES, owner=f"router-{n}", limit=3).claimed == 0:
                        break
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=router, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    with connect(control_dsn) as conn:
        assert counts(conn, reg) == (25, 50)
        (left,) = conn.execute(
            "SELECT count(*) FROM ingress_receipts WHERE registration_id = %s AND routing_status <> 'materialized'",
            (reg,),
        ).fetchone()
    assert left == 0


def test_routing_failures_retry_then_fail_terminally(control_conn, reg):
    calls = []

    def flaky(r):
        calls.append(r.attempts)
        raise RuntimeError("upstream parser exploded token=abc123secretvalue")

    routes = {"issues": Route("issues", 1, flaky)}
    rid = admit_receipt(control_conn, receipt(reg, "d1", max_routing_attempts=3)).receipt_id
    for _ in range(5):
        route_receipts(control_conn, routes, owner="r", limit=100, policy=FAST)
    status, attempts, error = control_conn.execute(
        "SELECT routing_status, routing_attempts, routing_error FROM ingress_receipts WHERE receipt_id = %s", (rid,)
    ).fetchone()
    assert status == "failed" and attempts == 3 and calls == [1, 2, 3]
    assert "abc123secretvalue" not in error and "RuntimeError" in error
    assert counts(control_conn, reg) == (0, 0)


def test_rejected_and_unknown_routes(control_conn, reg):
    def reject(r):
        raise RoutingRejected("payload kind is not supported")

    a = admit_receipt(control_conn, receipt(reg, "d1")).receipt_id
    b = admit_receipt(control_conn, receipt(reg, "d2", route_key="nope")).receipt_id
    route_receipts(control_conn, {"issues": Route("issues", 1, reject)}, owner="r", limit=100, policy=FAST)
    rows = dict(
        control_conn.execute(
            "SELECT receipt_id, routing_status FROM ingress_receipts WHERE receipt_id = ANY(%s)", ([a, b],)
        ).fetchall()
    )
    assert rows == {a: "failed", b: "pending"}  # rejected is terminal; an unknown route is retried


def _passes_the_body_on(r) -> list[EventSpec]:
    return [EventSpec(source_kind="issue", source_id=r.delivery_id, idempotency_key=f"issue:{r.delivery_id}",
                      payload=RECEIPT_BODY, work=[WorkSpec("ticket.observe")])]


def test_an_event_that_passes_its_receipts_body_on_holds_that_body_and_hash_as_stored(control_conn, reg):
    body = {"issue": "Überweisung 東京", "n": 1.5, "nested": {"b": [1, None, True], "a": "x\ny"}}
    rid = admit_receipt(control_conn, ReceiptIn(
        registration_id=reg, revision=1, namespace="tracker", delivery_id="d1", route_key="issues",
        received_at=NOW, body=body)).receipt_id
    report = route_receipts(control_conn, {"issues": Route("issues", 1, _passes_the_body_on)}, owner="r", limit=10)
    assert report.materialized == 1
    same = control_conn.execute(
        """SELECT e.payload = r.body AND e.payload_hash = r.payload_hash, e.payload
             FROM connector_outbox_events e JOIN ingress_receipts r USING (receipt_id) WHERE r.receipt_id = %s""",
        (rid,)).fetchone()
    assert same == (True, body)


def test_a_receipt_holding_its_body_by_reference_cannot_pass_it_on_and_fails_alone(control_conn, reg):
    by_ref = admit_receipt(control_conn, ReceiptIn(
        registration_id=reg, revision=1, namespace="tracker", delivery_id="d1", route_key="issues",
        received_at=NOW, body_ref="s3://bucket/d1")).receipt_id
    snapshot = admit_receipt(control_conn, receipt(reg, "d2")).receipt_id
    route_receipts(control_conn, {"issues": Route("issues", 1, _passes_the_body_on)}, owner="r", limit=10,
                   policy=FAST)
    rows = dict(control_conn.execute(
        "SELECT receipt_id, routing_status || ': ' || coalesce(routing_error, '') FROM ingress_receipts"
        " WHERE receipt_id = ANY(%s)", ([by_ref, snapshot],)).fetchall())
    assert rows[snapshot] == "materialized: "
    assert rows[by_ref].startswith("failed: ") and "by reference" in rows[by_ref]


def test_router_that_keeps_dying_reaches_terminal_failure(control_conn, reg):
    rid = admit_receipt(control_conn, receipt(reg, "d1", max_routing_attempts=2)).receipt_id
    for _ in range(3):
        claim_receipts(control_conn, owner="dies", limit=100, lease_ttl=timedelta(milliseconds=1))
        control_conn.execute("SELECT pg_sleep(0.01)")
    status, error_class = control_conn.execute(
        "SELECT routing_status, routing_error_class FROM ingress_receipts WHERE receipt_id = %s", (rid,)
    ).fetchone()
    assert (status, error_class) == ("failed", "attempts_exhausted")


def test_bulk_admission_skips_redeliveries_and_routes_like_single_admission(control_conn, reg):
    from datetime import datetime, timezone

    from nexus_pipelines.workqueue.receipts import admit_receipts, payload_hash

    now = datetime.now(timezone.utc)
    batch = [ReceiptIn(registration_id=reg, revision=1, namespace="poll", delivery_id=f"d{i}", route_key="k",
                       received_at=now, body={"n": i}) for i in range(3)]
    assert admit_receipts(control_conn, batch) == ["d0", "d1", "d2"]
    assert admit_receipts(control_conn, batch[1:] + [batch[0].model_copy(update={"delivery_id": "d9"})]) == ["d9"]
    rows = control_conn.execute(
        "SELECT delivery_id, routing_status, payload_hash FROM ingress_receipts WHERE registration_id = %s"
        " ORDER BY receipt_id", (reg,)).fetchall()
    assert [r[0] for r in rows] == ["d0", "d1", "d2", "d9"] and {r[1] for r in rows} == {"pending"}
    assert rows[0][2] == payload_hash({"n": 0})


def test_a_body_snapshot_is_held_to_the_limit_in_the_form_it_is_stored_in():
    from nexus_pipelines.workqueue.receipts import BODY_SNAPSHOT_LIMIT, canonical_json

    def with_body(body):
        return ReceiptIn(registration_id="r", revision=1, namespace="n", delivery_id="d", route_key="k",
                         received_at=NOW, body=body)

    at_limit = {"t": "x" * (BODY_SNAPSHOT_LIMIT - len('{"t":""}'))}
    assert len(with_body(at_limit).canonical_body) == BODY_SNAPSHOT_LIMIT == len(canonical_json(at_limit))
    with pytest.raises(ValueError, match="exceeds"):
        with_body({"t": at_limit["t"] + "x"})


def test_bulk_admission_stores_the_body_of_a_copy_given_another_body(control_conn, reg):
    from nexus_pipelines.workqueue.receipts import admit_receipts, payload_hash

    first = ReceiptIn(registration_id=reg, revision=1, namespace="poll", delivery_id="d0", route_key="k",
                      received_at=NOW, body={"n": 0})
    copy = first.model_copy(update={"delivery_id": "d1", "body": {"n": 1}})
    assert admit_receipts(control_conn, [first, copy]) == ["d0", "d1"]
    rows = control_conn.execute("SELECT body, payload_hash FROM ingress_receipts WHERE registration_id = %s"
                                " ORDER BY receipt_id", (reg,)).fetchall()
    assert rows == [({"n": 0}, payload_hash({"n": 0})), ({"n": 1}, payload_hash({"n": 1}))]


def test_a_page_of_deliveries_is_stored_like_receipts_admitted_one_by_one(control_conn, reg):
    from nexus_pipelines.workqueue.receipts import (
        Delivery, ReceiptSource, admit_page, admit_receipts, canonical_json, payload_hash,
    )

    source = ReceiptSource(registration_id=reg, revision=1, namespace="poll", route_key="k", event_kind="v")
    bodies = [{"n": i, "title": "Ünïcode ✓"} for i in range(3)]
    page = [Delivery(f"d{i}", NOW, {"ref": f"r{i}"}, canonical_json(b)) for i, b in enumerate(bodies)]
    assert admit_page(control_conn, source, page) == ["d0", "d1", "d2"]
    assert admit_page(control_conn, source, page) == []  # a redelivered page writes nothing
    single = ReceiptIn(registration_id=reg, revision=1, namespace="single", delivery_id="d0", route_key="k",
                       event_kind="v", received_at=NOW, correlation={"ref": "r0"}, body=bodies[0])
    assert admit_receipts(control_conn, [single]) == ["d0"]
    rows = control_conn.execute(
        """SELECT namespace, delivery_id, route_key, event_kind, received_at, correlation, body, payload_hash,
                  max_routing_attempts FROM ingress_receipts WHERE registration_id = %s ORDER BY receipt_id""",
        (reg,)).fetchall()
    assert [r[1] for r in rows] == ["d0", "d1", "d2", "d0"]
    assert rows[0][1:] == rows[3][1:]  # the same row but for its namespace
    assert [r[6] for r in rows[:3]] == bodies and [r[7] for r in rows[:3]] == [payload_hash(b) for b in bodies]


def test_a_page_document_encodes_each_string_of_its_rows_once(monkeypatch):
    import json
    from collections import Counter

    from nexus_pipelines.workqueue import receipts
    from nexus_pipelines.workqueue.receipts import Delivery, ReceiptSource, page_document

    encoded, plain = Counter(), json.encoder.encode_basestring_ascii

    def counted(text: str) -> str:  # how the document encodes every string it meets
        encoded[text] += 1
        return plain(text)

    monkeypatch.setattr(receipts, "_encode", counted)
    source = ReceiptSource(registration_id="acme/page", revision=1, namespace="poll", route_key="k", event_kind="v")
    # the correlation's keys and its revision are the same on every row; the refs carry a quote and non-ASCII
    page = [Delivery(f"r{i}@t#{i}", NOW, {"external_ref": f'gl:"{i}" ✓', "revision_id": "page@1"}, "{}")
            for i in range(3)]
    rows = json.loads(page_document(source, page))
    assert [(r["delivery_id"], r["correlation"]) for r in rows] == [(d.delivery_id, dict(d.correlation)) for d in page]
    assert encoded["revision_id"] == encoded["page@1"] == 1 and max(encoded.values()) == 1, encoded.most_common(3)


def test_a_page_delivery_is_held_to_the_snapshot_limit_and_needs_an_id(control_conn, reg):
    from nexus_pipelines.workqueue.receipts import BODY_SNAPSHOT_LIMIT, Delivery, ReceiptSource, admit_page

    source = ReceiptSource(registration_id=reg, revision=1, namespace="poll", route_key="k")
    too_big = '{"t":"' + "x" * BODY_SNAPSHOT_LIMIT + '"}'
    with pytest.raises(ValueError, match="exceeds"):
        admit_page(control_conn, source, [Delivery("d", NOW, {}, too_big)])
    with pytest.raises(ValueError, match="delivery id"):
        admit_page(control_conn, source, [Delivery("", NOW, {}, "{}")])
    with pytest.raises(ValueError):
        ReceiptSource(registration_id="", revision=1, namespace="poll", route_key="k")
    assert control_conn.execute("SELECT count(*) FROM ingress_receipts WHERE registration_id = %s",
                                (reg,)).fetchone() == (0,)


def test_splicing_a_canonical_value_in_gives_the_canonical_json_of_the_whole():
    from nexus_pipelines.workqueue.receipts import canonical_json, canonical_json_with

    inner = {"b": [1, "é"], "a": {"z": None, "y": 1.5}}
    body = {"zeta": "ü", "alpha": [3, 2], "mid": True}
    assert canonical_json_with(body, inner=canonical_json(inner)) == canonical_json({**body, "inner": inner})
