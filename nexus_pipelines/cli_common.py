"""What every `nexus-pipelines` command shares: the one way to report an error a user can
act on, the control-plane DSN, a control-plane connection that fails fast, and the
operator identity recorded on gate receipts and replays."""

from __future__ import annotations

import getpass
from collections.abc import Iterator
from contextlib import contextmanager

import click
import psycopg

from nexus_pipelines.redaction import one_line
from nexus_pipelines.settings import load_settings

CONNECT_TIMEOUT_S = 5


class UserError(click.ClickException):
    """A one-line error a user can act on (no traceback); exit code 1."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message, 1000))


def control_dsn() -> str:
    """NEXUS_PG_DSN; unset, one UserError naming `local up` (only the `local` commands and
    `demo` fall back to the embedded server, through the local stack)."""
    settings = load_settings()
    if settings.pg_dsn:
        return settings.pg_dsn
    from nexus_pipelines.local.stack import LocalStack

    raise UserError(
        "NEXUS_PG_DSN is not set: run `nexus-pipelines local up` and `. "
        f"{LocalStack(settings).env_file}`, or point NEXUS_PG_DSN at your control-plane Postgres"
    )


@contextmanager
def control_connection(dsn: str | None = None) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the control plane; an unreachable server is one UserError."""
    from nexus_pipelines.control.db import connect, safe_target

    dsn = dsn or control_dsn()
    try:
        conn = connect(dsn, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot reach the control plane at {safe_target(dsn)}: {reason}; "
                        "start it (`nexus-pipelines local up`) or fix NEXUS_PG_DSN") from None
    with conn:
        yield conn


def operator() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # noqa: BLE001 - no login name in some containers
        return "cli"
