"""Connections to the control-plane Postgres.

Every connection has `search_path` set to the control schema, so SQL in this
project names tables without a schema prefix and a deployment can choose its own
schema name.
"""

from __future__ import annotations

from psycopg import Connection
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool

from nexus_pipelines.settings import CONTROL_SCHEMA


def connect_kwargs(schema: str = CONTROL_SCHEMA) -> dict:
    return {"options": f"-c search_path={schema},public -c timezone=UTC"}


def connect(dsn: str, *, schema: str = CONTROL_SCHEMA, autocommit: bool = True, **kwargs) -> Connection:
    return Connection.connect(dsn, autocommit=autocommit, **connect_kwargs(schema), **kwargs)


def safe_target(dsn: str) -> str:
    """host:port/dbname of a DSN, without its user or password."""
    params = conninfo_to_dict(dsn)
    return f"{params.get('host', 'localhost')}:{params.get('port', 5432)}/{params.get('dbname', '')}"


def make_pool(dsn: str, *, schema: str = CONTROL_SCHEMA, min_size: int = 1, max_size: int = 8,
              check_on_checkout: bool = False) -> ConnectionPool:
    """A pool of autocommit connections; use `with conn.transaction():` for atomic work.
    `check_on_checkout` tests each connection before handing it out (one round trip), so a
    server restarted since is no failed request for a long-lived server such as the pages."""
    kwargs = {"autocommit": True, **connect_kwargs(schema)}
    pool = ConnectionPool(dsn, min_size=min_size, max_size=max_size, kwargs=kwargs, open=False, name="nexus-control",
                          check=ConnectionPool.check_connection if check_on_checkout else None)
    pool.open(wait=True, timeout=30)
    return pool
