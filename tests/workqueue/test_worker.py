from __future__ import annotations

import gc
import threading
import time

from nexus_pipelines.workqueue.handlers import NOOP, HandlerRegistry, PermanentError
from nexus_pipelines.workqueue.retry import RetryPolicy
from nexus_pipelines.workqueue.worker import drain

from .conftest import enqueue, items

FAST = RetryPolicy(base_s=0, cap_s=0, jitter=0)


def states(conn, reg):
    return dict(
        conn.execute(
            "SELECT state, count(*) FROM connector_work_items WHERE registration_id = %s GROUP BY state", (reg,)
        ).fetchall()
    )


def test_drain_runs_handlers_and_records_outcomes(control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(5, "ok") + items(2, "flaky", max_attempts=2) + items(1, "bad"))

    def flaky(item):
        raise RuntimeError("temporary outage secret=shhh12345")

    def bad(item):
        raise PermanentError("cannot map this record")

    registry = HandlerRegistry({"ok": lambda item: "done", "flaky": flaky, "bad": bad})
    report = drain(control_dsn, registry, registration_ids=[reg], concurrency=3, retry_policy=FAST, time_budget_s=30)
    assert report.completed == 5 and report.dead == 3 and report.retried == 2 and report.lost == 0
    assert states(control_conn, reg) == {"completed": 5, "dead": 3}
    rows = control_conn.execute(
        "SELECT work_type, failure_class, failure_summary, outcome FROM connector_work_items"
        " WHERE registration_id = %s AND state = 'dead' ORDER BY work_type",
        (reg,),
    ).fetchall()
    assert rows[0][:2] == ("bad", "permanent") and rows[1][1] == "RuntimeError"
    assert all("shhh12345" not in r[2] for r in rows)
    (outcome,) = control_conn.execute(
        "SELECT DISTINCT outcome FROM connector_work_items WHERE registration_id = %s AND state = 'completed'", (reg,)
    ).fetchone()
    assert outcome == "done"


def test_lost_lease_is_detected_by_the_heartbeat_and_the_result_discarded(control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(1, "slow"))
    flagged = threading.Event()

    def slow(item):
        # another party takes the item over while the handler runs
        control_conn.execute(
            "UPDATE connector_work_items SET lease_token = lease_token + 1000000 WHERE work_id = %s", (item.work_id,)
        )
        flagged.set() if item.lease_lost.wait(10) else None
        return "done"

    report = drain(
        control_dsn, HandlerRegistry({"slow": slow}), registration_ids=[reg], lease_ttl_s=0.6, time_budget_s=20
    )
    assert flagged.is_set()
    assert report.lost == 1 and report.completed == 0
    assert states(control_conn, reg) == {"running": 1}  # untouched by the stale holder


def test_lease_is_renewed_while_a_handler_runs(control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(1, "long"))

    def long(item):
        time.sleep(1.5)  # three lease lengths
        return None

    report = drain(control_dsn, HandlerRegistry({"long": long}), registration_ids=[reg], lease_ttl_s=0.5, time_budget_s=20)
    assert report.completed == 1 and report.lost == 0
    (attempts, reclaims) = control_conn.execute(
        "SELECT attempts, reclaims FROM connector_work_items WHERE registration_id = %s", (reg,)
    ).fetchone()
    assert (attempts, reclaims) == (1, 0)


def test_max_items_and_noop_fast_path(control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(250, "n"))
    report = drain(control_dsn, HandlerRegistry({"n": NOOP}), registration_ids=[reg], max_items=120, claim_batch=50)
    assert report.claimed == 120 and report.completed == 120 and report.stopped == "max_items"
    report = drain(control_dsn, HandlerRegistry({"n": NOOP}), registration_ids=[reg], claim_batch=50)
    assert report.completed == 130 and report.stopped == "idle"


def test_time_budget_stops_claiming(control_conn, control_dsn, reg):
    enqueue(control_conn, reg, items(50, "s"))
    report = drain(
        control_dsn, HandlerRegistry({"s": lambda item: time.sleep(0.05)}), registration_ids=[reg], time_budget_s=0.3,
        concurrency=1,
    )
    assert report.stopped == "time_budget" and 0 < report.completed < 50 and report.lost == 0
    assert states(control_conn, reg).get("running", 0) == 0


def test_the_heap_that_existed_before_a_drain_is_frozen_while_it_runs_and_thawed_after(control_conn, control_dsn, reg):
    """A full collection would stop every worker thread while it scans the process's heap."""
    enqueue(control_conn, reg, items(4, "ok"))
    frozen: list[int] = []
    assert gc.get_freeze_count() == 0
    report = drain(control_dsn, HandlerRegistry({"ok": lambda item: frozen.append(gc.get_freeze_count())}),
                   registration_ids=[reg], retry_policy=FAST, time_budget_s=30)
    assert report.completed == 4 and len(frozen) == 4 and min(frozen) > 0
    assert gc.get_freeze_count() == 0


def test_item_reclaimed_and_reclaimed_again_by_the_same_drain_after_a_lost_lease_is_finalized(
    control_conn, control_dsn, reg
):
    from nexus_pipelines.control.db import connect
    from nexus_pipelines.workqueue import claims

    enqueue(control_conn, reg, items(1, "once"))
    calls = []

    def once(item):
        calls.append(item.token)
        if len(calls) == 1:
            # the lease runs out (a pause); the heartbeat notices, another worker reclaims it
            with connect(control_dsn) as other:
                other.execute(
                    "UPDATE connector_work_items SET lease_until = now() - interval '1 second' WHERE work_id = %s",
                    (item.work_id,),
                )
                assert item.lease_lost.wait(10)
                claims.reclaim_expired(other, policy=FAST)
            return "stale"
        return "done"

    report = drain(
        control_dsn, HandlerRegistry({"once": once}), registration_ids=[reg], lease_ttl_s=0.6, time_budget_s=20,
        retry_policy=FAST,
    )
    assert len(calls) == 2 and calls[1] > calls[0]
    assert report.lost == 1 and report.completed == 1
    assert states(control_conn, reg) == {"completed": 1}


def test_a_claim_that_lost_a_lane_race_does_not_end_the_drain_as_idle(control_conn, control_dsn, reg, monkeypatch):
    import psycopg

    from nexus_pipelines.workqueue import claims

    enqueue(control_conn, reg, items(3, "r", target_lane_key="hot"))
    real = claims.claim_batch
    calls = []

    class RacingConnection:
        """The claim statement hits the in-flight unique index (a concurrent claim won the lane)."""

        def execute(self, *args, **kwargs):
            raise psycopg.errors.UniqueViolation("duplicate key value violates unique constraint")

    def racing_claim_batch(conn, **kwargs):
        calls.append(1)
        return real(RacingConnection() if len(calls) == 1 else conn, **kwargs)

    monkeypatch.setattr(claims, "claim_batch", racing_claim_batch)
    report = drain(control_dsn, HandlerRegistry({"r": lambda item: "done"}), registration_ids=[reg], time_budget_s=20)
    assert report.completed == 3 and report.stopped == "idle"
    assert states(control_conn, reg) == {"completed": 3}


def test_retry_later_waits_at_least_the_delay_the_handler_names(control_conn, control_dsn, reg):
    from nexus_pipelines.workqueue.handlers import RetryLater

    enqueue(control_conn, reg, items(1, "throttled"))

    def throttled(item):
        raise RetryLater("provider asked to wait", 600)

    report = drain(control_dsn, HandlerRegistry({"throttled": throttled}), registration_ids=[reg], retry_policy=FAST,
                   time_budget_s=10)
    assert report.retried == 1
    (wait_s,) = control_conn.execute(
        "SELECT extract(epoch FROM run_after - now()) FROM connector_work_items WHERE registration_id = %s", (reg,)
    ).fetchone()
    assert 590 < wait_s <= 600


def test_a_drain_is_a_registered_claimant_while_it_runs_and_clears_rows_of_dead_drains(control_conn, control_dsn, reg):
    from datetime import timedelta

    from nexus_pipelines.workqueue import claimants

    enqueue(control_conn, reg, items(1, "seen"))
    claimants.register(control_conn, "dead-drain", [reg], timedelta(seconds=-1))  # its process died long ago
    seen = []

    def during(item):
        seen.extend(r[0] for r in control_conn.execute(
            "SELECT claimant_id FROM workqueue_claimants WHERE expires_at > clock_timestamp()"))
        return None

    report = drain(control_dsn, HandlerRegistry({"seen": during}), worker_id="drain-under-test", registration_ids=[reg])
    assert report.completed == 1 and "drain-under-test" in seen
    assert control_conn.execute(
        "SELECT count(*) FROM workqueue_claimants WHERE claimant_id IN ('drain-under-test', 'dead-drain')"
    ).fetchone() == (0,)
