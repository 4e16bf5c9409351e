"""`nexus-pipelines local up|status|down`: the embedded stack on one machine.

`up` starts (or reuses) Postgres and the BigQuery emulator, applies the control
migrations, writes a DAGSTER_HOME whose instance lives on the same Postgres, and
writes `<local_dir>/env`, a shell file with the variables the CLI, the UI and the
tests need. With NEXUS_PG_DSN set, that server is used instead of the embedded one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psycopg

from nexus_pipelines.control.db import safe_target
from nexus_pipelines.control.migrations import apply_migrations
from nexus_pipelines.local.bigquery_emulator import EmulatorProcess
from nexus_pipelines.local.dagster_home import write_local_home
from nexus_pipelines.local.postgres import EmbeddedPostgres, StackError, ensure_database
from nexus_pipelines.local.sandbox import PORTS, Ports, SandboxProcess, environment
from nexus_pipelines.settings import NexusSettings
from nexus_pipelines.connectors.registry import LOCAL_REGISTRATIONS_DIR

DATABASE = "nexus"


def simulators_text(ports: Ports) -> str:
    return f"NexusCRM :{ports[0]}, GitLab :{ports[1]}, GitHub :{ports[2]}, Jira :{ports[3]} (127.0.0.1)"


@dataclass(frozen=True)
class StackInfo:
    pg_dsn: str
    pg_embedded: bool
    bq_emulator_url: str
    dagster_home: Path
    env_file: Path
    migrations_applied: list[str]
    sandbox_ports: Ports = PORTS

    def lines(self) -> list[str]:
        source = "embedded" if self.pg_embedded else "NEXUS_PG_DSN"
        return [
            f"postgres       {self.pg_dsn}  ({source})",
            f"bigquery       {self.bq_emulator_url}  (emulator)",
            f"simulators     {simulators_text(self.sandbox_ports)}",
            f"dagster home   {self.dagster_home}",
            f"migrations     {len(self.migrations_applied)} applied now" if self.migrations_applied else "migrations     up to date",
            f"environment    . {self.env_file}",
        ]


class LocalStack:
    def __init__(self, settings: NexusSettings, *, sandbox_ports: Ports | None = None) -> None:
        self.settings = settings
        self.root = settings.local_dir
        self.postgres = EmbeddedPostgres(self.root / "postgres")
        self.emulator = EmulatorProcess(self.root / "emulator")
        self.dagster_home = self.root / "dagster_home"
        self.env_file = self.root / "env"
        self.sandbox = SandboxProcess(self.root, sandbox_ports or settings.sandbox_ports or PORTS)

    @property
    def embedded(self) -> bool:
        """The embedded server is meant: no NEXUS_PG_DSN, or the one this stack wrote into its env
        file (a shell that sourced it still means the embedded server, running or not)."""
        dsn = self.settings.pg_dsn
        return dsn is None or dsn == self.postgres.recorded_dsn(DATABASE)

    def up(self) -> StackInfo:
        embedded = self.embedded
        if embedded:
            server = self.postgres.start()
            ensure_database(server.dsn(), DATABASE)
            dsn = server.dsn(DATABASE)
        else:
            dsn = self.settings.pg_dsn
        try:
            applied = apply_migrations(dsn)
        except psycopg.OperationalError as exc:
            where = "the embedded server" if embedded else f"NEXUS_PG_DSN ({safe_target(dsn)})"
            raise StackError(f"cannot connect to {where}: {str(exc).strip().splitlines()[-1]}; "
                             "check that the server runs and the DSN is right") from exc
        bq_url = self.emulator.start()
        self.sandbox.start(bq_project=self.settings.bq_project, emulator_url=bq_url)
        write_local_home(self.dagster_home, dsn)
        self._write_env(dsn, bq_url)
        return StackInfo(dsn, embedded, bq_url, self.dagster_home, self.env_file, applied, self.sandbox.ports)

    def status(self) -> list[str]:
        pg = self.postgres.info()
        pg_line = f"postgres       running {pg.dsn(DATABASE)}" if pg else "postgres       stopped"
        if not self.embedded:
            pg_line = f"postgres       {self.settings.pg_dsn} (NEXUS_PG_DSN)"
        bq = self.emulator.url()
        return [
            pg_line,
            f"bigquery       running {bq}" if bq else "bigquery       stopped",
            f"simulators     running {simulators_text(self.sandbox.ports)}" if self.sandbox.running()
            else "simulators     stopped",
            f"dagster home   {self.dagster_home}" + ("" if (self.dagster_home / "dagster.yaml").exists() else " (not written)"),
        ]

    def down(self) -> list[str]:
        """Stop every part on its own (one already gone is fine); the names of those stopped now.
        Raises StackError naming each part that could not be stopped, after trying all of them."""
        parts = [("simulators", self.sandbox.stop), ("bigquery emulator", self.emulator.stop)]
        if self.embedded:
            parts.append(("postgres", self.postgres.stop))
        stopped, failed = [], []
        for name, stop in parts:
            try:
                if stop():
                    stopped.append(name)
            except (StackError, OSError) as exc:
                failed.append(f"{name} ({exc})")
        if failed:
            done = f"stopped: {', '.join(stopped)}; " if stopped else ""
            raise StackError(f"{done}could not stop {'; '.join(failed)}")
        return stopped

    def environment(self, dsn: str, bq_url: str) -> dict[str, str]:
        """The variables `. <local_dir>/env` exports: the stack's servers and the sandbox's credentials."""
        return {
            "NEXUS_PG_DSN": dsn,
            "NEXUS_BQ_EMULATOR_URL": bq_url,
            "NEXUS_BQ_PROJECT": self.settings.bq_project,
            "DAGSTER_HOME": str(self.dagster_home),
            "NEXUS_CONNECTORS_DIR": str(LOCAL_REGISTRATIONS_DIR),
            "NEXUS_LOCAL_STACK": "1",
            **environment(self.root, self.sandbox.ports),
        }

    def _write_env(self, dsn: str, bq_url: str) -> None:
        lines = [f"export {name}='{value}'" for name, value in self.environment(dsn, bq_url).items()]
        self.env_file.write_text("\n".join([*lines, ""]))
