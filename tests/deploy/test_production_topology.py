"""The production topology of deploy/, on this machine without containers: the code location served
over gRPC, dagster-webserver and dagster-daemon as separate processes with deploy/dagster.yaml
(Postgres storage, the queued run coordinator and its tag limits), an embedded Postgres as Dagster's
storage and the control plane, the provider sandbox's simulators over HTTP, the BigQuery emulator."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import yaml

from nexus_pipelines.control.db import connect
from nexus_pipelines.local import sandbox as local_sandbox
from nexus_pipelines.integrations.bigquery import make_bigquery_client
from nexus_pipelines.local import month_end_arr_source
from tests.conftest import drop_database, new_database, with_database

from .support import (
    BIN, IN_FLIGHT, PROJECT_ROOT, Service, Webserver, code_server_command, compose_command, free_port,
    one_shot_services, wait_for, write_dagster_home,
)

# Each run is a process of its own: on a loaded machine one takes up to a minute to start.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

WRITEBACK_JOB = "writeback_month_end_arr_job"
SOURCE_ROWS = 600  # 3 batches of 200; no row the CRM rejects, so every writeback run succeeds
BQ_PROJECT = "nexus-local"  # the project configs/jobs/month_end_arr.local.yaml reads


class Topology:
    def __init__(self, tmp, control_dsn: str, storage_dsn: str, bq_url: str) -> None:
        self.tmp, self.control_dsn, self.storage_dsn = tmp, control_dsn, storage_dsn
        self.sandbox = local_sandbox.Sandbox(tmp / "local", tuple(free_port() for _ in range(4)))
        self.sandbox.serve()
        self.gitlab = self.sandbox.trackers[0]
        self.code_port, web_port = free_port(), free_port()
        self.home = tmp / "dagster_home"
        write_dagster_home(self.home, self.code_port)
        self.env = self._environment(storage_dsn, bq_url)
        logs = tmp / "logs"
        logs.mkdir()
        self.code_server = Service("code-server", code_server_command(self.code_port), cwd=PROJECT_ROOT,
                                   env=self.env, log_dir=logs)
        self.webserver_process = Service("webserver", compose_command("webserver", web_port), cwd=self.home,
                                         env=self.env, log_dir=logs)
        self.daemon = Service("daemon", compose_command("daemon"), cwd=self.home, env=self.env, log_dir=logs)
        self.webserver = Webserver(web_port)

    def _environment(self, storage_dsn: str, bq_url: str) -> dict[str, str]:
        storage = psycopg.conninfo.conninfo_to_dict(storage_dsn)
        connectors = self.tmp / "connectors"
        connectors.mkdir()
        registration = yaml.safe_load((PROJECT_ROOT / "configs/connectors/local/demo-gitlab.yaml").read_text())
        registration["provider"]["base_url"] = f"http://127.0.0.1:{self.gitlab.port}"
        (connectors / "demo-gitlab.yaml").write_text(yaml.safe_dump(registration))
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "NEXUS"))},
            **local_sandbox.environment(self.tmp / "local", (self.sandbox.crm_port, *[t.port for t in
                                                                                       self.sandbox.trackers])),
            "DAGSTER_HOME": str(self.home),
            "DAGSTER_PG_USERNAME": storage.get("user", "postgres"),
            "DAGSTER_PG_PASSWORD": "unused-the-test-server-trusts-loopback",
            "DAGSTER_PG_HOST": storage.get("host", "127.0.0.1"),
            "DAGSTER_PG_PORT": str(storage.get("port", "5432")),
            "DAGSTER_PG_DB": storage["dbname"],
            "NEXUS_PG_DSN": self.control_dsn,
            "NEXUS_BQ_PROJECT": BQ_PROJECT,
            "NEXUS_BQ_EMULATOR_URL": bq_url,
            "NEXUS_LOCAL_STACK": "1",
            "NEXUS_CONNECTORS_DIR": str(connectors),
        }

    def start(self) -> None:
        for name in one_shot_services():
            self.run_one_shot(name)
        self.code_server.start()
        self.webserver_process.start()
        self.wait_serving(timeout_s=180)
        self.daemon.start()

    def run_one_shot(self, name: str) -> str:
        result = subprocess.run(compose_command(name), cwd=self.home, env=self.env, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr}"
        return result.stdout + result.stderr

    def wait_serving(self, timeout_s: float) -> dict:
        def serving():
            for service in (self.code_server, self.webserver_process):
                assert service.alive(), service.tail()
            return self.webserver.serving() and self.webserver.location()

        try:
            return wait_for(serving, "the webserver to load the code location over gRPC", timeout_s)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its last load error: {self.webserver.last_error[-1500:]}") from None

    def stop(self) -> None:
        for service in (self.daemon, self.webserver_process, self.code_server):
            service.stop()
        self.sandbox.stop()

    def cli(self, *args: str) -> str:
        result = subprocess.run([str(BIN / "nexus-pipelines"), *args], env=self.env, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    def sensors(self) -> list[str]:
        wanted = ("connectors_poll", "router", "drain")
        return [name for name in self.webserver.instigators() if name.endswith("_sensor")
                and any(part in name for part in wanted)]

    def start_sensors(self) -> None:
        states = self.webserver.instigators()
        for name in self.sensors():
            if states[name] != "RUNNING":
                self.webserver.start_sensor(name)

    def count(self, query: str) -> int:
        with connect(self.control_dsn) as conn:
            return conn.execute(query).fetchone()[0]

    def runs(self, job: str | None = None) -> list[dict]:
        return [run for run in self.webserver.runs() if job is None or run["jobName"] == job]

    def diagnostics(self) -> str:
        return "\n".join(s.tail() for s in (self.code_server, self.webserver_process, self.daemon))


@pytest.fixture(scope="module")
def topology(tmp_path_factory, control_dsn, pg_admin_dsn, bq_emulator_url):
    storage = new_database(pg_admin_dsn, None)
    with make_bigquery_client(BQ_PROJECT, "US", bq_emulator_url) as client:
        month_end_arr_source.seed_source(client, local_sandbox.SOURCE_DATASET, SOURCE_ROWS, negative_every=0,
                              load_run_id=f"topology-{uuid.uuid4().hex[:6]}")
    stack = Topology(tmp_path_factory.mktemp("topology"), control_dsn, with_database(pg_admin_dsn, storage),
                     bq_emulator_url)
    try:
        stack.start()
        yield stack
    except BaseException:
        print(stack.diagnostics())
        raise
    finally:
        stack.stop()
        drop_database(pg_admin_dsn, storage)


def test_the_schema_migrations_run_again_on_a_live_stack_as_no_ops(topology):
    # every `docker compose up` runs them again, while the services may be serving
    assert "migrations are up to date" in topology.run_one_shot("control_plane")
    with psycopg.connect(topology.storage_dsn) as conn:
        tables = lambda: conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0]  # noqa: E731
        before = tables()
        topology.run_one_shot("dagster_storage")
        assert tables() == before
    assert topology.webserver.serving()


def test_sensors_and_schedules_are_off_on_first_start_but_the_daily_sweep(topology):
    states = topology.webserver.instigators()
    assert len(topology.sensors()) == 3, states
    # the sweep is the net under the polls; it sweeps only activated registrations (none yet)
    assert states.pop("connectors_sweep_daily") == "RUNNING", states
    assert states and set(states.values()) == {"STOPPED"}, states


def test_turning_the_sensors_on_makes_the_daemon_turn_tracker_issues_into_tickets(topology):
    topology.cli("connectors", "activate", "demo-gitlab")
    topology.start_sensors()
    issues = local_sandbox.DEMO_ISSUES  # the sandbox's tracker also holds a task, which the connector skips
    wait_for(lambda: topology.count("SELECT count(*) FROM tickets") == issues, f"{issues} tickets", 420, every_s=2)
    succeeded = lambda: {run["jobName"] for run in topology.runs() if run["status"] == "SUCCESS"}  # noqa: E731
    jobs = wait_for(lambda: "workqueue_drain" in succeeded() and succeeded(), "the drain run to succeed", 300)
    assert {"connectors_poll", "workqueue_receipt_router", "workqueue_drain"} <= jobs


def _finished(topology, run_ids: list[str], timeout_s: float = 420) -> list[dict]:
    """The runs once all of them ended (a run process takes its time to start on a busy machine)."""
    def done():
        runs = {run["runId"]: run for run in topology.runs()}
        ended = [runs[r] for r in run_ids if r in runs and runs[r]["status"] not in IN_FLIGHT]
        return ended if len(ended) == len(run_ids) else None

    try:
        return wait_for(done, f"runs {run_ids} to end", timeout_s, every_s=2)
    except AssertionError as exc:
        states = {run["runId"]: run["status"] for run in topology.runs() if run["runId"] in run_ids}
        raise AssertionError(f"{exc}: {states}\n{topology.diagnostics()}") from None


def test_two_writeback_runs_requested_at_once_run_one_after_the_other(topology):
    first, second = topology.webserver.launch(WRITEBACK_JOB), topology.webserver.launch(WRITEBACK_JOB)
    runs = _finished(topology, [first, second])
    assert [run["status"] for run in runs] == ["SUCCESS", "SUCCESS"], topology.diagnostics()
    earlier, later = sorted(runs, key=lambda run: run["startTime"])
    assert earlier["endTime"] <= later["startTime"]  # the tag limit queued the second, it did not skip
    with connect(topology.control_dsn) as conn:
        ledger = conn.execute("SELECT status, started_at, ended_at FROM outbound_runs WHERE run_id = ANY(%s)"
                              " ORDER BY started_at", ([first, second],)).fetchall()
    assert [row[0] for row in ledger] == ["succeeded", "succeeded"]  # neither skipped_already_running
    assert ledger[0][2] <= ledger[1][1]  # never overlapping in the ledger


def _stop_sensors_and_wait_for_no_run_in_flight(topology) -> None:
    for name in topology.sensors():
        if topology.webserver.instigators()[name] == "RUNNING":
            topology.webserver.stop_sensor(name)
    wait_for(lambda: not [run for run in topology.runs() if run["status"] in IN_FLIGHT], "no run in flight", 300,
             every_s=2)


def test_killing_the_daemon_mid_run_leaves_no_run_stuck_and_no_work_item_lost(topology):
    topology.cli("connectors", "activate", "demo-gitlab")
    # The daemon dies while a writeback run is executing and another is queued behind it; no launch is in
    # progress at that moment (run monitoring fails a run whose launch died with the daemon, after
    # run_monitoring.start_timeout_seconds).
    _stop_sensors_and_wait_for_no_run_in_flight(topology)
    tickets = topology.count("SELECT count(*) FROM tickets")
    now = datetime.now(UTC)
    for n in range(3):
        topology.gitlab.state.add_issue(local_sandbox.GITLAB_PROJECT_ID, title=f"Filed during the outage {n}",
                                        description="", labels=["bug"], updated_at=now + timedelta(seconds=n))
    first, second = topology.webserver.launch(WRITEBACK_JOB), topology.webserver.launch(WRITEBACK_JOB)
    wait_for(lambda: any(run["runId"] in (first, second) and run["status"] == "STARTED"
                         for run in topology.runs(WRITEBACK_JOB)), "a writeback run to start", 300, every_s=0.2)
    topology.daemon.kill()  # as a lost host would: no shutdown
    time.sleep(2)
    topology.daemon.start()
    topology.start_sensors()
    runs = _finished(topology, [first, second])
    assert [run["status"] for run in runs] == ["SUCCESS", "SUCCESS"], topology.diagnostics()
    wait_for(lambda: topology.count("SELECT count(*) FROM tickets") == tickets + 3, "the 3 new tickets", 420,
             every_s=2)
    wait_for(lambda: topology.count("SELECT count(*) FROM connector_work_items WHERE state <> 'completed'") == 0,
             "every work item to complete", 300, every_s=2)
    assert topology.count("SELECT count(*) FROM ingress_receipts") == topology.count(
        "SELECT count(*) FROM connector_work_items")  # each delivered issue version became work, none was lost
    _stop_sensors_and_wait_for_no_run_in_flight(topology)  # and every run ended


def test_a_restarted_code_server_is_picked_up_by_the_webserver(topology):
    # Without containers the runs are processes of the code server: let them finish first.
    _stop_sensors_and_wait_for_no_run_in_flight(topology)
    before = topology.webserver.location()["locationOrLoadError"]["serverId"]
    topology.code_server.stop()
    topology.code_server.start()
    after = wait_for(lambda: topology.webserver.serving() and topology.webserver.location()["locationOrLoadError"]
                     ["serverId"] not in (None, before) and topology.webserver.location(),
                     "the webserver to load the restarted code server", 180)
    assert after["loadStatus"] == "LOADED"
    run_id = topology.webserver.launch(WRITEBACK_JOB)  # launched through the webserver, run by the new server
    (run,) = _finished(topology, [run_id])
    assert run["status"] == "SUCCESS", topology.diagnostics()
