"""Forward-only numbered migrations for the control plane.

Files are `sql/control/NNNN_name.sql`. `apply_migrations` takes a transaction-scoped
advisory lock, so processes racing at startup apply each file exactly once; every
applied file is recorded with its sha256, and an applied file whose text changed is
refused: add a new migration instead of editing an old one.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from psycopg import Connection, sql

from nexus_pipelines.control.db import connect
from nexus_pipelines.settings import CONTROL_SCHEMA, PROJECT_ROOT

MIGRATIONS_DIR = PROJECT_ROOT / "sql" / "control"
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# Any fixed 64-bit key; it names the "migrations" critical section cluster-wide.
_LOCK_KEY = 0x6E657875736D6967


class MigrationError(RuntimeError):
    """Migrations cannot be applied as they are; the message says what to do."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    @property
    def text(self) -> str:
        return self.path.read_text()

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if not match:
            raise MigrationError(f"migration file {path.name} must be named NNNN_snake_name.sql")
        found.append(Migration(int(match.group(1)), match.group(2), path))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files in {directory} share a version number")
    return found


def apply_migrations(dsn: str, *, schema: str = CONTROL_SCHEMA, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply pending migrations; returns the names applied by this call."""
    migrations = discover(directory)
    applied_now: list[str] = []
    with connect(dsn, schema=schema) as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version integer PRIMARY KEY,
                   name text NOT NULL,
                   checksum text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        recorded = dict(conn.execute("SELECT version, checksum FROM schema_migrations").fetchall())
        for migration in migrations:
            if migration.version in recorded:
                if recorded[migration.version] != migration.checksum:
                    raise MigrationError(
                        f"migration {migration.path.name} was changed after it was applied "
                        "(checksum differs); restore it and add a new numbered migration instead"
                    )
                continue
            conn.execute(migration.text)
            conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (migration.version, migration.name, migration.checksum),
            )
            applied_now.append(migration.path.name)
    return applied_now


def check_up_to_date(conn: Connection, directory: Path = MIGRATIONS_DIR) -> None:
    """Refuse to work against a control plane that is behind, or whose applied files were edited."""
    if conn.execute("SELECT to_regclass('schema_migrations')").fetchone() == (None,):
        raise MigrationError("the control plane has no migrations applied: run `nexus-pipelines migrate`")
    recorded = dict(conn.execute("SELECT version, checksum FROM schema_migrations").fetchall())
    for migration in discover(directory):
        if migration.version not in recorded:
            raise MigrationError(f"migration {migration.path.name} is not applied: run `nexus-pipelines migrate`")
        if recorded[migration.version] != migration.checksum:
            raise MigrationError(f"applied migration {migration.path.name} differs from the file in this release")


def applied_versions(dsn: str, *, schema: str = CONTROL_SCHEMA) -> list[int]:
    with connect(dsn, schema=schema) as conn:
        return [row[0] for row in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
