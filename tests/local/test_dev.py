"""`nexus-pipelines local dev` (`make dev`): it stops in one line when the pages cannot bind
their port, leaving nothing of its own running, and a SIGINT (Ctrl-C) stops every process it
started, the Dagster UI's own children included."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from nexus_pipelines.local.stack import LocalStack
from nexus_pipelines.settings import NexusSettings

from .support import free_ports


@pytest.fixture(scope="module")
def stack_env(tmp_path_factory):
    """A local stack of this module's own (its folder and sandbox ports), up before `local dev` reuses it."""
    root, ports = tmp_path_factory.mktemp("dev") / "stack", free_ports()
    env = {k: v for k, v in os.environ.items() if k != "NEXUS_PG_DSN"}
    env.update({"NEXUS_LOCAL_DIR": str(root), "NEXUS_SANDBOX_PORTS": json.dumps(list(ports))})
    stack = LocalStack(NexusSettings(local_dir=root, pg_dsn=None, sandbox_ports=ports))
    stack.up()
    yield env
    stack.down()


class Dev:
    """`local dev` in a process (and session) of its own, its output collected line by line."""

    def __init__(self, env: dict[str, str], pages_port: int, dagster_port: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "nexus_pipelines.cli", "local", "dev", "--pages-port", str(pages_port),
             "--dagster-port", str(dagster_port)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            assert self.process.poll() is None and time.monotonic() < deadline, "\n".join(self.lines[-30:])
            time.sleep(0.2)


def listening(port: int) -> bool:
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in psutil.net_connections("tcp"))


def wait_listening(port: int, timeout_s: float, dev: Dev) -> None:
    deadline = time.monotonic() + timeout_s
    while not listening(port):
        assert dev.process.poll() is None and time.monotonic() < deadline, "\n".join(dev.lines[-30:])
        time.sleep(0.5)


def test_dev_stops_in_one_line_when_the_pages_port_is_taken_and_leaves_nothing_running(stack_env):
    pages_port, dagster_port = free_ports(2)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", pages_port))
    squatter.listen()
    try:
        dev = Dev(stack_env, pages_port, dagster_port)
        code = dev.process.wait(timeout=120)
    finally:
        squatter.close()
    time.sleep(0.5)  # the output thread reads the last line
    assert code == 1
    assert not any("Traceback" in line for line in dev.lines)
    error = [line for line in dev.lines if line.startswith("error:")]
    assert len(error) == 1 and re.match(
        rf"error: the ticket pages cannot serve on 127\.0\.0\.1:{pages_port} \(it exited with code \d+: "
        rf"port {pages_port} is held by pid {os.getpid()} \(", error[0]), error
    assert not any("Dagster UI on" in line for line in dev.lines)
    assert not listening(dagster_port)
    assert not [p for p in psutil.process_iter(["cmdline"]) if "--pages-port" in (p.info["cmdline"] or [])
                or str(pages_port) in (p.info["cmdline"] or [])]


def test_sigint_stops_every_process_dev_started(stack_env):
    pages_port, dagster_port = free_ports(2)
    dev = Dev(stack_env, pages_port, dagster_port)
    try:
        dev.wait_for(f"ticket pages on http://127.0.0.1:{pages_port}/", 120)
        wait_listening(dagster_port, 180, dev)
        started = psutil.Process(dev.process.pid).children(recursive=True)
        commands = [" ".join(p.cmdline()) for p in started]
        assert any("tickets serve" in c for c in commands) and any("dagster dev" in c for c in commands), commands
        assert len(started) >= 4, commands  # the pages, dagster dev, and the UI's webserver, daemon, code server
        os.kill(dev.process.pid, signal.SIGINT)
        assert dev.process.wait(timeout=90) == 0
    finally:
        if dev.process.poll() is None:
            os.killpg(dev.process.pid, signal.SIGKILL)
    left = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [p.cmdline() for p in left]
    assert not listening(pages_port) and not listening(dagster_port)
