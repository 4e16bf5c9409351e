"""`nexus-pipelines local dev` (`make dev`): the local stack, the ticket pages and the Dagster UI.

It brings the stack up (as `local up`), starts the pages and waits until their own process
listens on the pages port, then starts `dagster dev`. Each child runs in a session of its
own, so a Ctrl-C in the terminal reaches this supervisor alone, which then stops every
process it started (each child and whatever that child started) before it returns. When
one child ends, the other is stopped too. The stack itself keeps running (`local down`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from nexus_pipelines.local.ports import wait_until_served
from nexus_pipelines.local.postgres import StackError
from nexus_pipelines.local.stack import LocalStack
from nexus_pipelines.settings import PROJECT_ROOT, NexusSettings

PAGES_START_S = 60.0
STOP_GRACE_S = 20.0  # dagster dev stops its webserver, daemon and code server within this


@dataclass
class Child:
    name: str
    process: subprocess.Popen

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to the child, then SIGKILL to whatever of its process tree is left after `grace_s`."""
        try:
            root = psutil.Process(self.process.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        if self.process.poll() is None:
            self.process.terminate()
        _, left = psutil.wait_procs(tree, timeout=grace_s)
        for process in left:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=5)
        self.process.wait()


def _start(name: str, command: list[str], env: dict[str, str], *, cwd: Path, log: Path | None = None) -> Child:
    out = log.open("ab") if log else None
    try:
        process = subprocess.Popen(command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT if out else None, start_new_session=True)
    finally:
        if out:
            out.close()
    return Child(name, process)


def run_dev(settings: NexusSettings, *, pages_port: int, dagster_port: int, echo: Callable[[str], None]) -> int:
    """Serve until SIGINT or SIGTERM, or until a child ends; the exit code."""
    stop = _stop_on_signals()
    stack = LocalStack(settings)
    try:
        info = stack.up()
    except StackError as exc:
        echo(f"error: the local stack did not come up: {exc}")
        return 1
    if stop.is_set():
        return 0
    echo(f"local stack ready (Postgres {info.pg_dsn}, BigQuery emulator {info.bq_emulator_url})")
    env = {**os.environ, **stack.environment(info.pg_dsn, info.bq_emulator_url),
           "PYTHONWARNINGS": "ignore:Function `dev_command` is superseded"}
    pages_log = settings.local_dir / "pages.log"
    pages = _start("ticket pages", [sys.executable, "-m", "nexus_pipelines.cli", "tickets", "serve",
                                    "--port", str(pages_port)], env, cwd=PROJECT_ROOT, log=pages_log)
    children = [pages]
    try:
        # the pages' own process listening on the port is the proof: uvicorn answers once it listens
        problem = wait_until_served(pages.process, [pages_port], lambda _: True, PAGES_START_S)
        if problem:
            echo(f"error: the ticket pages cannot serve on 127.0.0.1:{pages_port} ({problem}); free the port or "
                 f"run `make dev PAGES_PORT=<another>`; their log: {pages_log}")
            return 1
        echo(f"ticket pages on http://127.0.0.1:{pages_port}/ (log: {pages_log})")
        if stop.is_set():
            return 0
        # dagster dev keeps its own files in its working directory: the stack's folder, not the checkout
        children.append(_start("Dagster UI", [sys.executable, "-m", "dagster", "dev", "-w",
                                              str(PROJECT_ROOT / "workspace.yaml"), "-p", str(dagster_port)],
                               env, cwd=settings.local_dir))
        echo(f"Dagster UI on http://127.0.0.1:{dagster_port}/ (Ctrl-C stops it and the pages)")
        return _supervise(children, stop, echo)
    finally:
        for child in reversed(children):
            child.stop()


def _supervise(children: list[Child], stop: threading.Event, echo: Callable[[str], None]) -> int:
    while not stop.wait(0.5):
        for child in children:
            code = child.process.poll()
            if code is not None:
                echo(f"error: the {child.name} stopped (exit code {code}); stopping the rest")
                return code or 1
    echo("stopping the ticket pages and the Dagster UI")
    return 0


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop
