"""`nexus-pipelines`: the operator CLI."""

from __future__ import annotations

import sys
import time

import click

from nexus_pipelines.cli_common import UserError, control_dsn
from nexus_pipelines.settings import load_settings


@click.group()
def main() -> None:
    """Writeback, issue intake and durable work queues on one Postgres control plane."""


@main.group()
def local() -> None:
    """The embedded local stack (Postgres, BigQuery emulator, DAGSTER_HOME)."""


@local.command("up")
def local_up() -> None:
    """Start or reuse the stack, apply migrations and print where everything runs."""
    from nexus_pipelines.local.postgres import StackError
    from nexus_pipelines.local.stack import LocalStack

    started = time.monotonic()
    try:
        info = LocalStack(load_settings()).up()
    except StackError as exc:
        raise UserError(str(exc)) from exc
    for line in info.lines():
        click.echo(line)
    click.echo(f"ready in {time.monotonic() - started:.1f}s")


@local.command("dev")
@click.option("--pages-port", default=3100, type=click.IntRange(1, 65535), show_default=True)
@click.option("--dagster-port", default=3000, type=click.IntRange(1, 65535), show_default=True)
def local_dev(pages_port: int, dagster_port: int) -> None:
    """Bring the stack up, then serve the ticket pages and the Dagster UI until Ctrl-C."""
    from nexus_pipelines.local.dev import run_dev

    sys.exit(run_dev(load_settings(), pages_port=pages_port, dagster_port=dagster_port, echo=click.echo))


@local.command("status")
def local_status() -> None:
    """Say what of the stack is running."""
    from nexus_pipelines.local.stack import LocalStack

    for line in LocalStack(load_settings()).status():
        click.echo(line)


@local.command("down")
def local_down() -> None:
    """Stop the simulators, the emulator and the embedded Postgres (their data stays)."""
    from nexus_pipelines.local.postgres import StackError
    from nexus_pipelines.local.stack import LocalStack

    try:
        stopped = LocalStack(load_settings()).down()
    except StackError as exc:
        raise UserError(str(exc)) from exc
    click.echo("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


@main.command("migrate")
def migrate() -> None:
    """Apply pending control-plane migrations to NEXUS_PG_DSN."""
    from nexus_pipelines.cli_common import control_connection
    from nexus_pipelines.control.migrations import MigrationError, apply_migrations

    dsn = control_dsn()
    with control_connection(dsn):
        pass  # an unreachable server is one line, before the migration runner's own connect
    try:
        applied = apply_migrations(dsn)
    except MigrationError as exc:
        raise UserError(str(exc)) from exc
    click.echo("applied: " + ", ".join(applied) if applied else "migrations are up to date")


@main.command("demo")
def demo() -> None:
    """Bring the local stack up and show what runs where."""
    from nexus_pipelines.local.demo import run_demo

    sys.exit(run_demo(click.echo))


from nexus_pipelines.actors.cli import actors as _actors  # noqa: E402
from nexus_pipelines.connectors.cli import connectors as _connectors  # noqa: E402
from nexus_pipelines.tickets.cli import tickets as _tickets  # noqa: E402
from nexus_pipelines.workqueue.cli import queue as _queue  # noqa: E402

main.add_command(_queue)
main.add_command(_connectors)
main.add_command(_tickets)
main.add_command(_actors)
from nexus_pipelines.writeback.cli import run_job as _run_job, writeback as _writeback  # noqa: E402

main.add_command(_run_job)
main.add_command(_writeback)

if __name__ == "__main__":
    main()
