"""The BigQuery emulator (pip `bqemulator`), started so that it works with no internet.

At start the emulator insists on downloading DuckDB's `spatial` extension (GEOGRAPHY
support). Nothing here uses GEOGRAPHY, so the launcher replaces that step with a
no-op; the optional avro extension download is switched off the same way. Use
`InProcessEmulator` in tests (a background thread) and `EmulatorProcess` for the
local stack (a detached process that outlives the CLI).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from nexus_pipelines.local.pidfile import PidFile
from nexus_pipelines.local.ports import wait_until_served
from nexus_pipelines.local.postgres import StackError


def _offline_settings(data_dir: Path, port: int):
    from bqemulator.config import Settings
    from bqemulator.storage.engine import DuckDBEngine

    DuckDBEngine._load_spatial = lambda self: None  # GEOGRAPHY is unused; its download fails offline
    data_dir.mkdir(parents=True, exist_ok=True)
    return Settings(
        rest_host="127.0.0.1",
        rest_port=port,
        grpc_port=0,
        persistence_mode="persistent",
        data_dir=data_dir,
        enable_format_extensions=False,
        log_level="warning",
        metrics_enabled=False,
    )


class InProcessEmulator:
    """The emulator on a background thread (with its own event loop) of this process.

    Written here rather than taken from `bqemulator.testing`, whose package imports
    testcontainers (and so Docker's client) just to be imported.
    """

    def __init__(self, data_dir: Path) -> None:
        from bqemulator.server import EmulatorServer

        self._server = EmulatorServer(_offline_settings(data_dir, 0))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="bigquery-emulator", daemon=True)

    def start(self, timeout_s: float = 90.0) -> str:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._server.start(), self._loop).result(timeout_s)
        return self._server.rest_url

    def stop(self) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._server.stop(), self._loop).result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)


def is_serving(url: str) -> bool:
    try:
        return httpx.get(f"{url}/bigquery/v2/projects/probe/datasets", timeout=2).status_code < 500
    except httpx.HTTPError:
        return False


class EmulatorProcess:
    """The emulator as a detached process, found again through its pid and port files; it takes
    its recorded port again when that is free, so shells that sourced the env file keep working."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._pid_file = PidFile(root / "bigquery.pid")
        self._port_file = root / "bigquery.port"
        self.log_file = root / "bigquery.log"

    def url(self) -> str | None:
        """The endpoint when the emulator is running and answering, else None."""
        from nexus_pipelines.local.ports import serves_all

        pid = self._pid_file.pid()
        if not self._port_file.exists() or pid is None:
            return None
        port = int(self._port_file.read_text())
        url = f"http://127.0.0.1:{port}"
        return url if serves_all(pid, [port]) and is_serving(url) else None

    def start(self, timeout_s: float = 90.0) -> str:
        running = self.url()
        if running:
            return running
        from nexus_pipelines.local.postgres import listen_port

        self.root.mkdir(parents=True, exist_ok=True)
        port = listen_port(self._port_file)
        with self.log_file.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", __name__, "--port", str(port), "--data-dir", str(self.root / "bigquery")],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._pid_file.record(process.pid)
        self._port_file.write_text(str(port))
        url = f"http://127.0.0.1:{port}"
        problem = wait_until_served(process, [port], lambda _: is_serving(url), timeout_s)
        if problem:
            self.stop()
            raise StackError(f"BigQuery emulator did not start on {url} ({problem}); see {self.log_file} "
                             "(is bqemulator installed with duckdb>=2.0.1? run `make install`)")
        return url

    def stop(self) -> bool:
        return self._pid_file.stop(grace_s=5.0)


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the BigQuery emulator offline.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    args = parser.parse_args()
    from bqemulator.server import run_forever

    run_forever(_offline_settings(args.data_dir, args.port))


if __name__ == "__main__":
    main()
