"""`nexus-pipelines queue ...`: operator commands for the durable work queue."""

from __future__ import annotations

import json

import click

from nexus_pipelines.cli_common import UserError, control_connection, control_dsn, operator


@click.group("queue")
def queue() -> None:
    """Work queue state, dead letters, replays, drains and generation gates."""


@queue.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def stats_cmd(as_json: bool) -> None:
    """Depth per state and queue class, oldest due age, leases, reclaim/retry/dead counts."""
    from nexus_pipelines.workqueue.stats import queue_health

    with control_connection() as conn:
        health = queue_health(conn)
    if as_json:
        click.echo(json.dumps(health, sort_keys=True, default=str))
        return
    for key, value in health.items():
        click.echo(f"{key}: {json.dumps(value, sort_keys=True, default=str) if isinstance(value, dict) else value}")


@queue.group("dlq")
def dlq() -> None:
    """Dead-lettered work items."""


@dlq.command("list")
@click.option("--registration", default=None, help="Only this connector registration.")
@click.option("--after", default=0, type=int, help="Page after this work id.")
@click.option("--limit", default=50, type=click.IntRange(1, 1000))
def dlq_list(registration: str | None, after: int, limit: int) -> None:
    """Dead items with their event and receipt context."""
    from nexus_pipelines.workqueue.dlq import list_dead

    with control_connection() as conn:
        items = list_dead(conn, registration_id=registration, after_work_id=after, limit=limit)
    if not items:
        click.echo("no dead work items")
        return
    for item in items:
        click.echo(
            f"{item.work_id}\t{item.registration_id}@{item.revision}\t{item.work_type}\tattempts={item.attempts}"
            f"\treplays={item.replays}\tevent={item.event_id} ({item.source_kind}:{item.source_id})"
            f"\treceipt={item.receipt_id} ({item.namespace}/{item.delivery_id})"
            f"\t{item.failure_class}: {item.failure_summary}"
        )


@queue.command("replay")
@click.argument("work_id", type=int)
def replay_cmd(work_id: int) -> None:
    """Replay one dead work item as a new attempt (fails closed when unsafe)."""
    from nexus_pipelines.workqueue.dlq import ReplayRefused, replay

    with control_connection() as conn:
        try:
            result = replay(conn, work_id, requested_by=operator())
        except ReplayRefused as exc:
            raise UserError(f"replay refused: {exc}") from exc
    click.echo(f"work item {result.work_id} is pending again (replay {result.replays})")


@queue.command("drain")
@click.option("--queue-class", "queue_classes", multiple=True, help="Queue class to drain (repeatable).")
@click.option("--registration", "registrations", multiple=True, help="Registration to drain (repeatable).")
@click.option("--max-items", default=None, type=click.IntRange(1))
@click.option("--time-budget", "time_budget_s", default=60.0, type=click.FloatRange(0, min_open=True))
@click.option("--concurrency", default=4, type=click.IntRange(1, 64))
@click.option("--claim-batch", default=100, type=click.IntRange(1, 1000))
@click.option("--lease-ttl", "lease_ttl_s", default=60.0, type=click.FloatRange(0, min_open=True))
def drain_cmd(
    queue_classes: tuple[str, ...],
    registrations: tuple[str, ...],
    max_items: int | None,
    time_budget_s: float,
    concurrency: int,
    claim_batch: int,
    lease_ttl_s: float,
) -> None:
    """Run one drain in this process with the code location's handler registry."""
    from nexus_pipelines.bindings import build_handler_registry
    from nexus_pipelines.control.db import make_pool
    from nexus_pipelines.workqueue.worker import drain

    dsn = control_dsn()
    with control_connection(dsn):
        pass  # an unreachable control plane is one line, before a pool waits out its timeout
    pool = make_pool(dsn, max_size=concurrency + 2)
    try:
        registry = build_handler_registry(pool)
        if not registry:
            click.echo("warning: no work types are registered; nothing can be claimed", err=True)
        report = drain(
            pool,
            registry,
            queue_classes=list(queue_classes) or None,
            registration_ids=list(registrations) or None,
            max_items=max_items,
            time_budget_s=time_budget_s,
            concurrency=concurrency,
            claim_batch=claim_batch,
            lease_ttl_s=lease_ttl_s,
        )
    finally:
        pool.close()
    click.echo(json.dumps(report.as_dict(), sort_keys=True))


@queue.command("activate")
@click.argument("registration")
@click.argument("revision", type=int)
@click.option("--route", "routes", multiple=True, help="ROUTE_ID=VERSION bound by the receipt (repeatable).")
def activate_cmd(registration: str, revision: int, routes: tuple[str, ...]) -> None:
    """Write the activation receipt that makes a generation's work items claimable."""
    from nexus_pipelines.workqueue.generations import GenerationGateError, activate

    route_versions: dict[str, int] = {}
    for spec in routes:
        route_id, sep, version = spec.partition("=")
        if not sep or not version.isdigit():
            raise UserError(f"--route {spec!r} must look like ROUTE_ID=VERSION")
        route_versions[route_id] = int(version)
    with control_connection() as conn:
        try:
            receipt = activate(conn, registration, revision, recorded_by=operator(), route_versions=route_versions)
        except GenerationGateError as exc:
            raise UserError(f"activation refused: {exc}") from exc
    click.echo(f"{registration}@{revision} is active (activation receipt {receipt.receipt_id})")


@queue.command("quiesce")
@click.argument("registration")
@click.argument("revision", type=int)
def quiesce_cmd(registration: str, revision: int) -> None:
    """Stop new claims for a generation; records the drain proof once its leases reach zero."""
    from nexus_pipelines.workqueue.generations import GenerationGateError, quiesce, record_drained

    with control_connection() as conn:
        try:
            status = quiesce(conn, registration, revision, recorded_by=operator())
            if status.drained:
                receipt = record_drained(conn, registration, revision, recorded_by=operator())
                click.echo(f"{registration}@{revision} is quiesced and drained (drain receipt {receipt.receipt_id})")
            else:
                click.echo(
                    f"{registration}@{revision} is quiescing: {status.active_leases} active and "
                    f"{status.expired_leases} expired leases remain; run this again to record the drain proof"
                )
        except GenerationGateError as exc:
            raise UserError(f"quiesce refused: {exc}") from exc
