"""A drain survives a Postgres restart: it reconnects with capped backoff, carries on within
its time budget, and loses or doubles no item. Each test restarts a server of its own."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from nexus_pipelines.control.db import connect
from nexus_pipelines.control.migrations import apply_migrations
from nexus_pipelines.local.postgres import FAST_SETTINGS, EmbeddedPostgres, ensure_database, with_database
from nexus_pipelines.workqueue import claims
from nexus_pipelines.workqueue.handlers import HandlerRegistry
from nexus_pipelines.workqueue.retry import RetryPolicy
from nexus_pipelines.workqueue.worker import drain

from .conftest import enqueue, items
from .support import restart_postgres

pytestmark = pytest.mark.slow

FAST = RetryPolicy(base_s=0.05, cap_s=0.2, jitter=0.5)
_EFFECTS = "CREATE TABLE IF NOT EXISTS restart_effects (work_id bigint PRIMARY KEY, token bigint NOT NULL)"


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[tuple[EmbeddedPostgres, str]]:
    """A server for this test alone (the session's server is shared and must not restart)."""
    server = EmbeddedPostgres(tmp_path / "pg", settings=FAST_SETTINGS)
    info = server.start()
    name = f"restart_{uuid.uuid4().hex[:8]}"
    ensure_database(info.dsn(), name)
    dsn = with_database(info.dsn(), name)
    apply_migrations(dsn)
    try:
        yield server, dsn
    finally:
        server.stop()


class _RestartingHandler:
    """Applies each item's effect under its fence (keyed, first write wins); the `at`-th call
    restarts the server, keeping it down for a while, before applying its own effect."""

    def __init__(self, server: EmbeddedPostgres, dsn: str, at: int, down_s: float) -> None:
        self.server, self.dsn, self.at, self.down_s = server, dsn, at, down_s
        self.calls = 0
        self.lock = threading.Lock()
        self.restart_error: BaseException | None = None

    def __call__(self, item) -> str:
        with self.lock:
            self.calls += 1
            restart = self.calls == self.at
        if restart:
            try:
                restart_postgres(self.server, self.down_s)
            except BaseException as exc:  # the test's own restart failed: say so, not "no outage"
                self.restart_error = exc
                raise
        with connect(self.dsn) as conn, conn.transaction():
            if claims.lock_fence(conn, item):
                conn.execute("INSERT INTO restart_effects VALUES (%s, %s) ON CONFLICT DO NOTHING",
                             (item.work_id, item.token))
        return "applied"


def _queue(dsn: str, reg: str, n: int) -> None:
    with connect(dsn) as conn:
        conn.execute(_EFFECTS)
        enqueue(conn, reg, items(n, "t"))


def _outcome(dsn: str, reg: str) -> tuple[dict, int]:
    with connect(dsn) as conn:
        states = dict(conn.execute(
            "SELECT state, count(*) FROM connector_work_items WHERE registration_id = %s GROUP BY state", (reg,)
        ).fetchall())
        (effects,) = conn.execute("SELECT count(*) FROM restart_effects").fetchone()
    return states, effects


def test_a_drain_reconnects_after_a_postgres_restart_and_loses_or_doubles_no_item(own_postgres):
    server, dsn = own_postgres
    reg = "restart"
    _queue(dsn, reg, 200)
    handler = _RestartingHandler(server, dsn, at=60, down_s=1.5)
    outages: list[str] = []
    report = drain(dsn, HandlerRegistry({"t": handler}), registration_ids=[reg], concurrency=4, claim_batch=20,
                   time_budget_s=60, retry_policy=FAST, on_outage=outages.append)

    assert handler.restart_error is None, f"the test could not restart Postgres: {handler.restart_error}"
    assert report.outages >= 1 and report.outage_s > 0
    assert any("connection lost" in m for m in outages) and any("reconnected after" in m for m in outages)
    states, effects = _outcome(dsn, reg)
    assert states == {"completed": 200}
    assert effects == 200
    assert report.completed == 200 and report.lost == 0  # each item completed once, none given up


def test_a_drain_gives_up_with_one_line_when_postgres_stays_down_past_its_budget(own_postgres):
    import re

    from nexus_pipelines.workqueue.session import DEFAULT_MAX_OUTAGE_S, ControlPlaneUnavailable

    server, dsn = own_postgres
    _queue(dsn, "down", 5)

    def stop_for_good(item) -> str:
        server.stop()
        return "done"

    with pytest.raises(ControlPlaneUnavailable, match=r"control plane unreachable for \d+s .*giving up") as raised:
        drain(dsn, HandlerRegistry({"t": stop_for_good}), registration_ids=["down"], time_budget_s=2,
              lease_ttl_s=1, claim_batch=1)
    assert "\n" not in str(raised.value)
    # the drain's own budget (2 s plus one lease) ended the wait, not the default outage limit
    assert int(re.search(r"unreachable for (\d+)s", str(raised.value)).group(1)) < DEFAULT_MAX_OUTAGE_S


def test_the_sensor_launched_drain_run_reports_the_outage_in_its_log(own_postgres):
    from dagster import DagsterInstance

    from nexus_pipelines.control.resources import ControlPlaneResource
    from nexus_pipelines.workqueue.jobs import build_drain_job
    from nexus_pipelines.workqueue.sensors import drain_requests

    server, dsn = own_postgres
    reg = "restart-dagster"
    _queue(dsn, reg, 80)
    handler = _RestartingHandler(server, dsn, at=20, down_s=1.0)
    job = build_drain_job(lambda pool: HandlerRegistry({"t": handler}), name="restart_drain")
    (request,) = drain_requests({"default": 80}, in_flight=0, bucket=1, job_name="restart_drain")
    run_config = request.run_config
    run_config["ops"]["restart_drain_op"]["config"].update(registration_ids=[reg], time_budget_s=60)
    instance = DagsterInstance.ephemeral()
    result = job.execute_in_process(run_config=run_config, tags=request.tags, instance=instance,
                                    resources={"control_plane": ControlPlaneResource(dsn=dsn)})

    assert result.success
    summary = result.output_for_node("restart_drain_op")
    assert summary["outages"] >= 1 and summary["lost"] == 0
    messages = [e.message for e in instance.all_logs(result.run_id) if e.message]
    assert any("connection lost" in m and "reconnecting with backoff" in m for m in messages)
    assert any("reconnected after" in m for m in messages)
    assert any("the control plane was unreachable" in m for m in messages)
    # handlers that met the outage failed their attempt: those items wait for their retry
    states, _ = _outcome(dsn, reg)
    assert set(states) <= {"completed", "retry"} and sum(states.values()) == 80
    time.sleep(1.1)  # the retry policy's first delay, then the sensor's next run drains the rest
    again = job.execute_in_process(run_config=run_config, instance=instance,
                                   resources={"control_plane": ControlPlaneResource(dsn=dsn)})
    assert again.output_for_node("restart_drain_op")["completed"] == states.get("retry", 0)
    assert _outcome(dsn, reg) == ({"completed": 80}, 80)


def _down_for(server: EmbeddedPostgres, dsn: str, down_s: float) -> threading.Thread:
    """Restart `server` on a thread, keeping it down for `down_s`; returns once it is down."""
    import psycopg

    restarting = threading.Thread(target=restart_postgres, args=(server, down_s), daemon=True)
    restarting.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            connect(dsn, connect_timeout=1).close()
        except psycopg.OperationalError:
            return restarting
        time.sleep(0.05)
    raise AssertionError("the server did not go down")


def test_a_drain_started_during_an_outage_waits_for_postgres_within_its_budget(own_postgres):
    server, dsn = own_postgres
    reg = "started-down"
    _queue(dsn, reg, 20)
    restarting = _down_for(server, dsn, down_s=2.0)
    outages: list[str] = []
    report = drain(dsn, HandlerRegistry({"t": lambda item: "done"}), registration_ids=[reg], time_budget_s=60,
                   retry_policy=FAST, on_outage=outages.append, idle_exit=True)
    restarting.join(timeout=60)
    assert report.completed == 20 and report.outages >= 1
    assert any("(claims): cannot connect (" in m and "reconnecting with backoff" in m for m in outages)
    assert any("reconnected after" in m for m in outages)
    assert _outcome(dsn, reg)[0] == {"completed": 20}


def test_an_outage_before_the_heartbeats_first_beat_is_waited_out_not_fatal(own_postgres):
    server, dsn = own_postgres
    reg = "heartbeat-down"
    _queue(dsn, reg, 5)
    # The first handler stops Postgres at once and keeps it down past the heartbeat's first
    # beat (half the lease, at most 5 s), but not past the 14 s lease itself, even with the
    # seconds a stop and start take on a busy machine (a 6 s lease lost items to a slow restart).
    handler = _RestartingHandler(server, dsn, at=1, down_s=6.0)
    outages: list[str] = []
    report = drain(dsn, HandlerRegistry({"t": handler}), registration_ids=[reg], concurrency=1, claim_batch=5,
                   lease_ttl_s=14, time_budget_s=60, retry_policy=FAST, on_outage=outages.append, idle_exit=True)
    assert any("(heartbeat): connection lost" in m for m in outages)
    assert report.lost == 0 and report.completed + report.retried == 5
    states, _ = _outcome(dsn, reg)
    assert sum(states.values()) == 5 and set(states) <= {"completed", "retry"}


def test_when_reachable_waits_out_an_outage_then_gives_up_with_one_line_at_its_deadline(own_postgres):
    from nexus_pipelines.workqueue.session import ControlPlaneUnavailable, when_reachable

    server, dsn = own_postgres
    restarting = _down_for(server, dsn, down_s=1.5)
    lines: list[str] = []
    conn = when_reachable(lambda: connect(dsn, connect_timeout=1), give_up_at=time.monotonic() + 60,
                          on_outage=lines.append, name="drain w1")
    conn.close()
    restarting.join(timeout=60)
    assert lines[0].startswith("drain w1: cannot connect (") and lines[1].startswith("drain w1: reconnected after")
    server.stop()
    with pytest.raises(ControlPlaneUnavailable, match=r"^drain w1: control plane unreachable for \d+s \(.*\); "
                                                      r"giving up$"):
        when_reachable(lambda: connect(dsn, connect_timeout=1), give_up_at=time.monotonic() + 1,
                       on_outage=lines.append, name="drain w1")
