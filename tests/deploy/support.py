"""The production topology of deploy/ run as separate processes on this machine: the code location
served over gRPC by the user-code image's command, dagster-webserver and dagster-daemon with the
compose file's commands and deploy/dagster.yaml (Dagster's default run launcher in place of the
DockerRunLauncher, as there are no containers here), Postgres as Dagster's storage."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

from nexus_pipelines.settings import PROJECT_ROOT

DEPLOY = PROJECT_ROOT / "deploy"
BIN = Path(sys.executable).parent
LOCATION = "nexus_pipelines"
REPOSITORY = "__repository__"
IN_FLIGHT = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(check: Callable[[], object], what: str, timeout_s: float, every_s: float = 1.0):
    """The first truthy result of `check`; fails naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(every_s)


def _bind(command: list[str], host: str, port: int) -> list[str]:
    """A service command with its listen host and port replaced (loopback and a free port here)."""
    bound = [host if arg == "0.0.0.0" else arg for arg in command]
    flag = bound.index("-p")
    bound[flag + 1] = str(port)
    return bound


def code_server_command(port: int) -> list[str]:
    """The user-code image's CMD (deploy/Dockerfile.user-code), on loopback and `port`."""
    (cmd,) = re.findall(r"^CMD (\[.*\])$", (DEPLOY / "Dockerfile.user-code").read_text(), flags=re.MULTILINE)
    command = _bind(json.loads(cmd), "127.0.0.1", port)
    return [str(BIN / command[0]), *command[1:]]


def _compose_services() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]


def compose_command(service: str, port: int | None = None) -> list[str]:
    """A service's entrypoint in deploy/docker-compose.yml, on loopback and `port` when it listens."""
    command = _compose_services()[service]["entrypoint"]
    if port is not None:
        command = _bind(command, "127.0.0.1", port)
    return [str(BIN / command[0]), *command[1:]]


def one_shot_services() -> list[str]:
    """The compose services another waits on to complete (the schema migrations), in file order."""
    services = _compose_services()
    awaited = {name for service in services.values() for name, dependency in service.get("depends_on", {}).items()
               if dependency["condition"] == "service_completed_successfully"}
    return [name for name in services if name in awaited]


def write_dagster_home(home: Path, code_port: int) -> None:
    """deploy/dagster.yaml (storage from the DAGSTER_PG_* variables, queue, tag limits, run monitoring)
    without its run_launcher, and deploy/workspace.yaml pointed at the code server's port."""
    home.mkdir(parents=True, exist_ok=True)
    instance = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
    instance.pop("run_launcher")
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance, sort_keys=False))
    workspace = yaml.safe_load((DEPLOY / "workspace.yaml").read_text())
    workspace["load_from"][0]["grpc_server"].update(host="127.0.0.1", port=code_port)
    (home / "workspace.yaml").write_text(yaml.safe_dump(workspace, sort_keys=False))


class Service:
    """One process of the topology in a process group of its own (its run workers included), logged
    to a file; `stop` ends the group, `kill` SIGKILLs it as a crash would."""

    def __init__(self, name: str, command: list[str], *, cwd: Path, env: dict[str, str], log_dir: Path) -> None:
        self.name, self.command, self.cwd, self.env = name, command, cwd, env
        self.log = log_dir / f"{name}.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> Service:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.command, cwd=self.cwd, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        self._signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.process is None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait(timeout=30)
        self._signal(signal.SIGKILL)  # children that outlived their parent (run workers)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.name} ({self.log}) ---\n" + "\n".join(text.splitlines()[-lines:])


class Webserver:
    """GraphQL of a running dagster-webserver."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/graphql"
        self.last_error = ""  # the code location's load error, when the webserver reported one

    def query(self, text: str, **variables) -> dict:
        response = httpx.post(self.url, json={"query": text, "variables": variables}, timeout=60)
        response.raise_for_status()
        body = response.json()
        assert "errors" not in body, body["errors"]
        return body["data"]

    def serving(self) -> bool:
        try:
            entry = self.location()
        except (httpx.HTTPError, AssertionError, KeyError, TypeError, ValueError):
            return False
        error = entry["locationOrLoadError"] or {}
        if error.get("__typename") == "PythonError":
            self.last_error = error["message"]
        return entry["loadStatus"] == "LOADED" and error.get("__typename") == "RepositoryLocation"

    def location(self) -> dict:
        data = self.query("""{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus
            locationOrLoadError { __typename ... on RepositoryLocation { serverId } ... on PythonError { message } }
        } } } }""")
        (entry,) = data["workspaceOrError"]["locationEntries"]
        return entry

    def instigators(self) -> dict[str, str]:
        """{sensor or schedule name: its status}."""
        data = self.query("""{ workspaceOrError { ... on Workspace { locationEntries { locationOrLoadError {
            __typename ... on RepositoryLocation { repositories { name
                sensors { name sensorState { status } } schedules { name scheduleState { status } } } }
            ... on PythonError { message } } } } } }""")
        (entry,) = data["workspaceOrError"]["locationEntries"]
        (repository,) = entry["locationOrLoadError"]["repositories"]
        return {**{s["name"]: s["sensorState"]["status"] for s in repository["sensors"]},
                **{s["name"]: s["scheduleState"]["status"] for s in repository["schedules"]}}

    def start_sensor(self, name: str) -> None:
        data = self.query("""mutation($selector: SensorSelector!) { startSensor(sensorSelector: $selector) {
            __typename ... on Sensor { sensorState { status } } ... on PythonError { message } } }""",
                          selector=self._sensor(name))
        assert data["startSensor"].get("sensorState", {}).get("status") == "RUNNING", data

    def stop_sensor(self, name: str) -> None:
        data = self.query("""query($selector: SensorSelector!) { sensorOrError(sensorSelector: $selector) {
            ... on Sensor { sensorState { id } } } }""", selector=self._sensor(name))
        data = self.query("""mutation($id: String!) { stopSensor(id: $id) {
            __typename ... on StopSensorMutationResult { instigationState { status } }
            ... on PythonError { message } } }""", id=data["sensorOrError"]["sensorState"]["id"])
        assert data["stopSensor"].get("instigationState", {}).get("status") == "STOPPED", data

    @staticmethod
    def _sensor(name: str) -> dict:
        return {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "sensorName": name}

    def launch(self, job: str) -> str:
        data = self.query("""mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
            __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
            ... on RunConfigValidationInvalid { errors { message } } } }""",
                          params={"selector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY,
                                               "jobName": job}, "runConfigData": {}})
        assert data["launchRun"]["__typename"] == "LaunchRunSuccess", data
        return data["launchRun"]["run"]["runId"]

    def runs(self) -> list[dict]:
        data = self.query("""{ runsOrError(limit: 500) { ... on Runs { results {
            runId jobName status startTime endTime } } } }""")
        return data["runsOrError"]["results"]
