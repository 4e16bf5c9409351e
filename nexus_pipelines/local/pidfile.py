"""A detached process of the local stack, found again through its pid file.

The file holds the pid and the process's start time, so a pid the system has since given
to another process is never taken for ours (nor signalled); a file of only a pid (written
before start times were kept) is ours when its process names the file's folder on its
command line, as the stack's launchers do. Stopping a process that is
already gone is no error: `make down` stops every part on its own.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil


class PidFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self, pid: int) -> None:
        self.path.write_text(f"{pid} {_started_at(pid)}")

    def pid(self) -> int | None:
        """The recorded process when it is still alive and still the same process, else None."""
        try:
            pid_text, _, started = self.path.read_text().partition(" ")
            pid = int(pid_text)
        except (OSError, ValueError):  # no file, or one cut short by a crash
            return None
        if not alive(pid):
            return None
        if not started:  # a file written before start times were kept: its process names our folder
            return pid if _names(pid, self.path.parent) else None
        return pid if started.strip() == _started_at(pid) else None

    def stop(self, grace_s: float = 10.0) -> bool:
        """SIGTERM, then SIGKILL after `grace_s`; False when it was not running."""
        pid = self.pid()
        self.path.unlink(missing_ok=True)
        if pid is None or not _signal(pid, signal.SIGTERM):
            return False
        if not _gone_within(pid, grace_s):
            _signal(pid, signal.SIGKILL)  # one that ignores SIGTERM (inherited from its launcher)
            _gone_within(pid, 5.0)
        return True


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def _started_at(pid: int) -> str:
    try:
        return repr(psutil.Process(pid).create_time())
    except psutil.Error:
        return "gone"


def _names(pid: int, folder: Path) -> bool:
    try:
        return any(str(folder) in arg for arg in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def _signal(pid: int, signum: int) -> bool:
    """Send `signum`; False when the process had already gone."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def alive(pid: int) -> bool:
    """Running, not a zombie (one still answers kill(0) until its parent reaps it; a zombie
    child of this process is reaped here)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited:
            return False
    except ChildProcessError:
        pass
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
