"""A detached process of the local stack, found again through its pid file."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


class PidFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self, pid: int) -> None:
        self.path.write_text(str(pid))

    def pid(self) -> int | None:
        """The recorded process when it is still alive, else None."""
        if not self.path.exists():
            return None
        pid = int(self.path.read_text())
        return pid if alive(pid) else None

    def stop(self, grace_s: float = 10.0) -> bool:
        """SIGTERM, then SIGKILL after `grace_s`; False when it was not running."""
        pid = self.pid()
        self.path.unlink(missing_ok=True)
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not alive(pid):
                return True
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
        return True


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of this process still answers kill(0)
        waited, _ = os.waitpid(pid, os.WNOHANG)
        return waited == 0
    except ChildProcessError:
        return True
