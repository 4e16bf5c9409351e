"""One provider gate per origin and credential, in the control plane: drain workers, polls and
processes share a provider's stated wait, and a close held by it spends no attempt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime

import httpx
import pytest

from nexus_pipelines.connectors.core import store
from nexus_pipelines.connectors.github.limits import CONTENT_BUDGET, LIMIT_STATUSES
from nexus_pipelines.connectors.provider_gate import GatePolicy, ProviderGates
from nexus_pipelines.integrations.http import ENDPOINT
from nexus_pipelines.local.simulators.github import SecondaryLimit
from nexus_pipelines.local.simulators.gitlab import RateLimit
from nexus_pipelines.local.simulators.http import SimClock
from nexus_pipelines.local.worlds.github import GitHubWorld
from nexus_pipelines.local.worlds.plant import Plant
from nexus_pipelines.local.worlds.tokens import gitlab_token
from tests.connectors.served import PROJECT_ID, serve_gitlab
from tests.connectors.support import tickets_by_ref


@pytest.fixture
def plant(pool):
    return Plant(GitHubWorld(), pool)


def _closes_waiting(plant, request, count):
    """`count` polled GitHub issues whose tickets carry an accepted proof: `count` issue.close items."""
    registration = plant.world.registration(key="gate-" + str(abs(hash(request.node.name)) % 10**8))
    plant.activate(registration)
    refs = plant.world.add_issues(count)
    plant.sync([registration])
    with plant.pool.connection() as conn:
        tickets = tickets_by_ref(conn, registration)
    for n, ref in enumerate(refs):
        plant.prove(tickets[ref]["ticket_id"], request_id=f"proof-{n}")
    return registration, refs


def _close_items(pool, registration):
    with pool.connection() as conn:
        return conn.execute(
            """SELECT state, attempts - unstarted_attempts, extract(epoch FROM run_after - now())
                 FROM connector_work_items WHERE registration_id = %s AND work_type = 'issue.close'
                ORDER BY work_id""", (registration.registration_id,)).fetchall()


def _comment_requests(world):
    return sum(1 for op, method in world.requests() if op == "comment" and method == "POST")


def test_two_drain_workers_stop_writing_when_github_states_a_secondary_limit(plant, pool, request):
    registration, refs = _closes_waiting(plant, request, 12)
    plant.world.state.secondary = SecondaryLimit(creations=3, retry_after=60)
    plant.world.clear_requests()
    report = plant.drain([registration.registration_id])  # two handler threads
    # 3 comments land, the 4th is refused with retry-after; the other worker may have one write
    # in flight when that answer arrives (a gate cannot recall a sent request), none starts after
    assert _comment_requests(plant.world) <= 5 and plant.world.state.limited_calls <= 1
    assert sum(len(plant.world.comments(ref)) for ref in refs) == 3
    # an item whose comment landed just before the hold closes on its retry (it reconciles first)
    assert report.dead == 0 and report.completed in (2, 3)
    waiting = [row for row in _close_items(pool, registration) if row[0] == "retry"]
    assert len(waiting) == 12 - report.completed
    assert all(counted == 0 and 55 <= wait <= 61 for _, counted, wait in waiting)  # no attempt spent


def test_a_poll_is_held_by_the_wait_a_close_back_write_met(plant, pool, request):
    registration, _ = _closes_waiting(plant, request, 2)
    plant.world.state.secondary = SecondaryLimit(creations=0, retry_after=120)
    plant.drain([registration.registration_id])
    plant.world.clear_requests()
    report = plant.poll([registration])
    (tick,) = report.ticks
    assert plant.world.requests() == [] and tick.outcome == "failure" and "nothing was sent" in tick.failure
    assert 115 <= tick.retry_in_s <= 121
    with pool.connection() as conn:
        (view,) = store.progress(conn, [registration.registration_id])
    assert view.last_failure.startswith("throttled") and "installation" in view.last_failure


def test_a_manual_poll_keeps_the_wait_a_throttled_poll_learned(plant, pool, request):
    registration, _ = _closes_waiting(plant, request, 1)
    plant.world.state.secondary = SecondaryLimit(creations=0, retry_after=300)
    plant.drain([registration.registration_id])
    plant.poll([registration])  # held by the gate: the poll learns the wait
    with pool.connection() as conn:
        (requested,) = store.request_poll(conn, [registration.registration_id])
        (due_in,) = conn.execute(
            """SELECT extract(epoch FROM next_poll_at - now()) FROM connector_progress
                WHERE registration_key = %s""", (registration.key,)).fetchone()
    assert requested.held_until is not None and 290 <= due_in <= 301
    line = requested.line()
    assert line.startswith(f"{registration.registration_id}: keeps the provider's wait until ")
    assert "throttled" in line and "\n" not in line


def _github_budget(pool):
    policy = GatePolicy.for_origin("https://api.github.example", "installation 9", LIMIT_STATUSES, CONTENT_BUDGET)
    with pool.connection() as conn:
        conn.execute("DELETE FROM provider_gates WHERE gate_key = %s", (policy.key,))
    return ProviderGates(pool), policy


def _github_request(method, endpoint):
    return httpx.Request(method, "https://api.github.example/repos/o/r/issues/1", extensions={ENDPOINT: endpoint})


def test_githubs_content_creation_past_80_a_minute_waits_for_the_oldest_to_age_out(pool):
    gates, policy = _github_budget(pool)
    assert [gates.admit(policy, spends=True) for _ in range(80)] == [None] * 80
    held = gates.admit(policy, spends=True)
    assert held is not None and 56 <= held.wait_s <= 61  # a minute after the first, and a second's slack
    assert held.said == "at most 80 content-creating requests per minute"
    assert gates.admit(policy, spends=False) is None  # a request that creates nothing goes out


def test_githubs_content_creation_past_500_an_hour_waits_for_the_hours_oldest_to_age_out(pool):
    gates, policy = _github_budget(pool)
    with pool.connection() as conn:  # 500 creations spread over the last hour, 7 s apart, none in the last minute
        conn.execute("""INSERT INTO provider_gates (gate_key, recent_writes)
                        SELECT %s, array_agg(now() - make_interval(secs => 3590 - 7 * n))
                          FROM generate_series(0, 499) n""", (policy.key,))
    held = gates.admit(policy, spends=True)
    assert held is not None and 10 <= held.wait_s <= 11 and held.said.endswith("500 content-creating requests per hour")


def test_only_the_requests_githubs_adapter_says_create_content_spend_the_budget(pool):
    gates, policy = _github_budget(pool)
    gate = gates.gate(policy)
    for method, endpoint in [("PATCH", "update_issue"), ("POST", "create_token"), ("GET", "list_comments"),
                             ("POST", "create_comment"), ("GET", "an_endpoint_no_one_classified"), ("GET", None)]:
        gate.admit(_github_request(method, endpoint))
    with pool.connection() as conn:
        (counted,) = conn.execute("SELECT cardinality(recent_writes) FROM provider_gates WHERE gate_key = %s",
                                  (policy.key,)).fetchone()
    assert counted == 3  # the comment, and the two requests nobody classified (the safe side)


def _content_writes_counted(pool) -> int:
    with pool.connection() as conn:
        row = conn.execute("""SELECT cardinality(recent_writes) FROM provider_gates
                                WHERE gate_key LIKE '% installation %'""").fetchone()
    return row[0] if row else 0


def test_a_close_back_of_n_issues_spends_n_content_creating_requests_not_its_closes_or_token(plant, pool, request):
    with pool.connection() as conn:
        conn.execute("DELETE FROM provider_gates")
    registration, refs = _closes_waiting(plant, request, 4)  # the sync mints the installation token
    report = plant.drain([registration.registration_id])
    assert report.completed == 4 and all(plant.world.issue_state(ref) == "closed" for ref in refs)
    # one comment each; the close PATCH and the token exchange create no content on GitHub
    assert _content_writes_counted(pool) == 4


def _gate_process(dsn, served, path):
    env = {**os.environ, served.token_env: served.token, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "tests.connectors.gate_process", dsn, str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_new_processes_know_a_wait_another_process_learned_and_send_nothing(tmp_path, pool, control_dsn):
    served, stop = serve_gitlab(tmp_path, key="gate-processes", token=gitlab_token("gate-0123456789abcdefghij"))
    path = served.folder / "gate-processes.yaml"
    try:
        served.state.add_issue(PROJECT_ID, title="limited")
        served.state.rate_limit = RateLimit(limit=0, window_s=3600)
        # the limit's hour starts now, so its Retry-After is an hour whatever the time of day (on the real
        # clock, a test run in an hour's last minute was told to wait seconds)
        served.state.clock = SimClock(datetime.now(UTC).replace(minute=0, second=0, microsecond=0))
        with pool.connection() as conn:
            conn.execute("DELETE FROM provider_gates")
        first = _gate_process(control_dsn, served, path)  # meets the 429 and holds the gate
        out, err = first.communicate(timeout=120)
        assert json.loads(out)["reason"] == "throttled", err
        both = [_gate_process(control_dsn, served, path) for _ in range(2)]  # started after it ended, at once
        results = [json.loads(p.communicate(timeout=120)[0]) for p in both]
        assert all(r["reason"] == "throttled" and "nothing was sent" in r["detail"] for r in results)
        assert served.state.limited_calls == 0  # no request reached GitLab after its 429
        assert all(r["retry_after_seconds"] > 60 for r in results)
    finally:
        stop()


def test_a_gate_the_control_plane_cannot_answer_sends_nothing_and_says_why(control_dsn):
    from nexus_pipelines.control.db import make_pool
    from nexus_pipelines.integrations.http import GateClosed

    closed = make_pool(control_dsn, max_size=1)
    closed.close()
    gate = ProviderGates(closed).gate(GatePolicy.for_origin("https://gitlab.example", "token env:T", frozenset({429})))
    with pytest.raises(GateClosed, match="could not be read.*nothing was sent") as held:
        gate.admit(httpx.Request("GET", "https://gitlab.example/api/v4/projects/1/issues"))
    assert held.value.wait_s == 5.0
    gate.observe(httpx.Response(429, headers={"Retry-After": "30"}))  # the answer still reaches the adapter
