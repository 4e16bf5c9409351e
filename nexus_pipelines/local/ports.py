"""Which process listens on a loopback port: the local stack proves that each of its ports is
served by the process it started, not by whatever else answers there (another checkout's
stack, a `make demo` still running, an unrelated server)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable

import psutil


def listeners(ports: Iterable[int]) -> dict[int, int | None]:
    """The pid listening on each of `ports` over TCP (None: no one, or a process we may not see;
    a system that shows no other process's sockets to this user shows none)."""
    found: dict[int, int | None] = dict.fromkeys(ports)
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return found
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port in found and conn.pid:
            found[conn.laddr.port] = conn.pid
    return found


def describe_holder(pid: int) -> str:
    """A process for an error line: its pid and the start of its command line."""
    try:
        command = " ".join(psutil.Process(pid).cmdline()[:4])
    except psutil.Error:
        return f"pid {pid}"
    return f"pid {pid} ({command[:120]})"


def serves_all(pid: int, ports: Iterable[int]) -> bool:
    """Process `pid` itself listens on every one of `ports` (read from its own sockets)."""
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return set(ports) <= {c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN and c.laddr}


def held_by_others(pid: int, ports: Iterable[int]) -> str:
    """'port P is held by <holder>' for each of `ports` another process than `pid` listens on."""
    return ", ".join(f"port {port} is held by {describe_holder(holder)}"
                     for port, holder in sorted(listeners(ports).items()) if holder not in (None, pid))


def wait_until_served(process: subprocess.Popen, ports: Iterable[int], answers: Callable[[int], bool],
                      timeout_s: float) -> str | None:
    """Wait until `process` itself listens on every port and each of them `answers`; None then,
    else (it exited, or `timeout_s` passed) what stood in the way, in words for one line."""
    ports = tuple(ports)
    deadline = time.monotonic() + timeout_s
    while not (serves_all(process.pid, ports) and all(answers(port) for port in ports)):
        ended = process.poll() is not None
        if ended or time.monotonic() > deadline:
            why = f"it exited with code {process.returncode}" if ended else f"it did not answer within {timeout_s:.0f}s"
            others = held_by_others(process.pid, ports)
            return f"{why}: {others}" if others else why
        time.sleep(0.2)
    return None
