"""The control plane as a Dagster resource."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from dagster import ConfigurableResource, InitResourceContext
from psycopg import Connection
from psycopg_pool import ConnectionPool
from pydantic import Field, PrivateAttr

from nexus_pipelines.control.db import make_pool
from nexus_pipelines.control.migrations import check_up_to_date
from nexus_pipelines.settings import CONTROL_SCHEMA


class ControlPlaneResource(ConfigurableResource):
    """Pooled autocommit connections to the control-plane Postgres schema."""

    dsn: str = Field(description="libpq DSN; set it with EnvVar('NEXUS_PG_DSN') so its value never shows in the UI.")
    control_schema: str = Field(default=CONTROL_SCHEMA, description="Schema holding the control tables.")
    pool_max_size: int = Field(default=8, ge=2, le=64, description=(
        "Connections a run may hold at once: a drain holds two (claims and lease renewals), a router two "
        "(claims and writes)."))

    _pool: ConnectionPool | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._pool = None  # opened on first use, so runs that never touch Postgres never connect

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        self.close()

    def pool(self) -> ConnectionPool:
        if self._pool is None:
            pool = make_pool(self.dsn, schema=self.control_schema, max_size=self.pool_max_size)
            try:
                with pool.connection() as conn:
                    check_up_to_date(conn)
            except Exception:
                pool.close()
                raise
            self._pool = pool
        return self._pool

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        with self.pool().connection() as conn:
            yield conn

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
