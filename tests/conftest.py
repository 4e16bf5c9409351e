"""Shared fixtures: one real Postgres server and one BigQuery emulator per session.

Postgres is the embedded server (started in a temporary folder) unless
NEXUS_PG_DSN points at a server whose role may create databases. Each test module
gets a fresh database cloned from a template that already holds every control
migration, so modules are isolated and cheap to set up. The emulator runs on a
background thread; modules isolate themselves with their own dataset names.
"""

from __future__ import annotations

import os

# gRPC (loaded by Dagster) installs fork handlers; a test that forks a child with a
# pre-exec step (pg_ctl run as the server's user) while gRPC threads run can see that child
# die with SIGSEGV before it execs. Its fork support is not needed in tests.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
import signal

# A suite started in the background of a non-interactive shell (`make test &`) inherits
# SIGINT ignored, and an in-process Dagster run copies SIGINT's handler onto SIGTERM: every
# child a later test starts would then ignore SIGTERM (a pool that never terminates, a stack
# process that outlives `stop`). Python's own SIGINT handler keeps SIGTERM meaningful.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from nexus_pipelines.control.db import connect
from nexus_pipelines.control.migrations import apply_migrations
from nexus_pipelines.local.postgres import (
    FAST_SETTINGS,
    EmbeddedPostgres,
    drop_database,
    ensure_database,
    with_database,
)


@pytest.fixture(scope="session")
def pg_admin_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """DSN of a database on the test server from which others can be created."""
    external = os.environ.get("NEXUS_PG_DSN")
    if external:
        yield external
        return
    server = EmbeddedPostgres(tmp_path_factory.mktemp("pg"), settings=FAST_SETTINGS)
    info = server.start()
    try:
        yield info.dsn()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_template(pg_admin_dsn: str) -> Iterator[str]:
    """Name of a migrated template database."""
    name = f"nexus_tpl_{uuid.uuid4().hex[:8]}"
    ensure_database(pg_admin_dsn, name)
    apply_migrations(with_database(pg_admin_dsn, name))
    yield name
    drop_database(pg_admin_dsn, name)


def new_database(pg_admin_dsn: str, template: str | None) -> str:
    name = f"nexus_t_{uuid.uuid4().hex[:10]}"
    ensure_database(pg_admin_dsn, name, template=template)
    return name


def _database_while_held(pg_admin_dsn: str, template: str | None) -> Iterator[str]:
    """The DSN of a fresh database (a copy of `template`, or empty), dropped after the fixture."""
    name = new_database(pg_admin_dsn, template)
    yield with_database(pg_admin_dsn, name)
    drop_database(pg_admin_dsn, name)


@pytest.fixture(scope="module")
def control_dsn(pg_admin_dsn: str, pg_template: str) -> Iterator[str]:
    """A fresh, fully migrated control-plane database for this test module."""
    yield from _database_while_held(pg_admin_dsn, pg_template)


@pytest.fixture
def empty_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A fresh database with no migrations applied, for migration tests."""
    yield from _database_while_held(pg_admin_dsn, None)


@pytest.fixture
def control_conn(control_dsn: str) -> Iterator[psycopg.Connection]:
    with connect(control_dsn) as conn:
        yield conn


@pytest.fixture
def own_dsn(pg_admin_dsn: str, pg_template: str) -> Iterator[str]:
    """A fresh, fully migrated control-plane database for one test: a test whose plans follow
    the statistics it takes (ANALYZE) sees only its own rows in them, not what the other tests
    of its module left in the module's database."""
    yield from _database_while_held(pg_admin_dsn, pg_template)


@pytest.fixture
def own_conn(own_dsn: str) -> Iterator[psycopg.Connection]:
    with connect(own_dsn) as conn:
        yield conn


@pytest.fixture(scope="session")
def bq_emulator_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from nexus_pipelines.local.bigquery_emulator import InProcessEmulator

    emulator = InProcessEmulator(Path(tmp_path_factory.mktemp("bq")))
    url = emulator.start()
    try:
        yield url
    finally:
        emulator.stop()


@pytest.fixture(scope="session")
def bq_client(bq_emulator_url: str):
    from nexus_pipelines.integrations.bigquery import make_bigquery_client

    return make_bigquery_client("nexus-test", "US", bq_emulator_url)


@pytest.fixture(scope="module")
def bq_dataset(bq_client) -> str:
    """A dataset of this test module's own."""
    name = f"ds_{uuid.uuid4().hex[:10]}"
    bq_client.create_dataset(name)
    return name


@pytest.fixture(scope="module")
def pool(control_dsn: str):
    """A connection pool on this module's control-plane database."""
    from nexus_pipelines.control.db import make_pool

    pool = make_pool(control_dsn, max_size=8)
    yield pool
    pool.close()
