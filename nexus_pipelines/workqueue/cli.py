"""`nexus-pipelines queue ...`: operator commands for the durable work queue.

Every refusal of a gate (activation, quiesce, rollback, re-cutover, confirmation) is
one line naming the blocking fact. So is a refusal of the database's claim-path guards
(0017, 0018) under `activate`, `rollback` and `recutover`: a guard raises SQLSTATE
23000 and its transaction is rolled back. Any other database error is a bug and keeps
its traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import click
import psycopg

from nexus_pipelines.cli_common import UserError, control_connection, control_dsn, operator


@contextmanager
def _gate(refused: str, refusals: tuple[type[Exception], ...], unchanged: str) -> Iterator[None]:
    """A gate's own refusal, or its guard's, as one line: `refused: ...`."""
    try:
        yield
    except refusals as exc:
        raise UserError(f"{refused}: {exc}") from exc
    except psycopg.errors.IntegrityConstraintViolation as exc:  # 23000 only: what the guards raise
        raise UserError(f"{refused} by the database: {exc.diag.message_primary}; {unchanged}") from exc


@click.group("queue")
def queue() -> None:
    """Work queue state, dead letters, replays, drains, generation gates and rollbacks."""


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
            f"{item.work_id}\t{item.registration_id}@{item.revision}\t{item.claim_path}\t{item.work_type}"
            f"\tattempts={item.attempts}"
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
    from nexus_pipelines.workqueue.worker import drain

    report = _with_registry(concurrency, lambda pool, registry: drain(
        pool,
        registry,
        queue_classes=list(queue_classes) or None,
        registration_ids=list(registrations) or None,
        max_items=max_items,
        time_budget_s=time_budget_s,
        concurrency=concurrency,
        claim_batch=claim_batch,
        lease_ttl_s=lease_ttl_s,
        on_outage=lambda message: click.echo(f"warning: {message}", err=True),
    ))
    click.echo(json.dumps(report.as_dict(), sort_keys=True))


def _with_registry(concurrency: int, run):
    """Run `run(pool, registry)` with the code location's handler registry on a fresh pool."""
    from nexus_pipelines.bindings import build_handler_registry
    from nexus_pipelines.control.db import make_pool
    from nexus_pipelines.workqueue.session import ControlPlaneUnavailable

    dsn = control_dsn()
    with control_connection(dsn):
        pass  # an unreachable control plane is one line, before a pool waits out its timeout
    pool = make_pool(dsn, max_size=concurrency + 2)
    try:
        registry = build_handler_registry(pool)
        if not registry:
            click.echo("warning: no work types are registered; nothing can be claimed", err=True)
        return run(pool, registry)
    except ControlPlaneUnavailable as exc:
        raise UserError(str(exc)) from exc
    finally:
        pool.close()


@queue.command("event-drain")
@click.argument("registration")
@click.argument("revision", type=int)
@click.option("--max-items", default=None, type=click.IntRange(1))
@click.option("--time-budget", "time_budget_s", default=60.0, type=click.FloatRange(0, min_open=True))
@click.option("--lease-ttl", "lease_ttl_s", default=60.0, type=click.FloatRange(0, min_open=True))
def event_drain_cmd(registration: str, revision: int, max_items: int | None, time_budget_s: float,
                    lease_ttl_s: float) -> None:
    """Run the Event path of an Event-owned generation in this process (one ordered consumer)."""
    from nexus_pipelines.workqueue.event_path import run_event_path

    with control_connection() as conn:
        _known_generation(conn, registration, revision)
    report = _with_registry(1, lambda pool, registry: run_event_path(
        pool, registry, registration, revision, max_items=max_items, time_budget_s=time_budget_s,
        lease_ttl_s=lease_ttl_s, on_outage=lambda message: click.echo(f"warning: {message}", err=True),
    ))
    if report.stopped == "lease_held":
        raise UserError(f"the scheduler lease of {registration}@{revision} is held by another executor; "
                        "one Event path runs a generation at a time")
    click.echo(json.dumps(report.as_dict(), sort_keys=True))


def _route_versions(routes: tuple[str, ...]) -> dict[str, int]:
    """`--route` pairs, each a route the code location binds at that version; none given: all of them."""
    from nexus_pipelines.bindings import route_versions as bound

    known = bound()
    if not routes:
        return known
    route_versions: dict[str, int] = {}
    for spec in routes:
        route_id, sep, version = spec.partition("=")
        if not sep or not version.isdigit():
            raise UserError(f"--route {spec!r} must look like ROUTE_ID=VERSION")
        if known.get(route_id) != int(version):
            bound_text = ", ".join(f"{r}={v}" for r, v in sorted(known.items()))
            raise UserError(f"--route {spec!r} is not a route this code location binds (it binds {bound_text})")
        route_versions[route_id] = int(version)
    return route_versions


def _known_generation(conn, registration: str, revision: int) -> None:
    """Refuse a generation the code location does not know (a typo, or text that is not a name)."""
    from nexus_pipelines.bindings import known_generations

    known = known_generations(conn)
    if (registration, revision) not in known:
        shown = ", ".join(f"{r}@{n}" for r, n in known[:8]) + (" ..." if len(known) > 8 else "")
        raise UserError(f"unknown generation {registration!r}@{revision}: the registered connector revisions are "
                        f"{shown or 'none'} (`nexus-pipelines connectors activate` registers them)")


@queue.command("activate")
@click.argument("registration")
@click.argument("revision", type=int)
@click.option("--route", "routes", multiple=True, help="ROUTE_ID=VERSION bound by the receipt (repeatable).")
@click.option("--event-path", is_flag=True, help="Activate it for the Event path (one ordered consumer).")
def activate_cmd(registration: str, revision: int, routes: tuple[str, ...], event_path: bool) -> None:
    """Write the activation receipt that makes a generation claimable (resumes a rollback in progress)."""
    from nexus_pipelines.workqueue.generations import GenerationGateError, activate
    from nexus_pipelines.workqueue.states import EVENT_PATH, WORK_ITEM_PATH

    with control_connection() as conn:
        _known_generation(conn, registration, revision)
        with _gate("activation refused", (GenerationGateError,), "nothing was changed"):
            receipt = activate(conn, registration, revision, recorded_by=operator(),
                               route_versions=_route_versions(routes),
                               claim_path=EVENT_PATH if event_path else WORK_ITEM_PATH)
    path = "the Event path" if event_path else "work item claims"
    click.echo(f"{registration}@{revision} is active for {path} (receipt {receipt.receipt_id})")


@queue.command("rollback")
@click.argument("registration")
@click.argument("revision", type=int)
def rollback_cmd(registration: str, revision: int) -> None:
    """Hand a WorkItem generation to the Event path: stop its claims, then fence its pending work.

    Run it again while the fence is refused (it names what blocks it); `queue activate`
    abandons the rollback.
    """
    from nexus_pipelines.workqueue.rollback import RollbackRefused, disable_claims, fence

    with control_connection() as conn:
        _known_generation(conn, registration, revision)
        with _gate("rollback fence refused", (RollbackRefused,),
                   f"nothing was fenced (`queue activate {registration} {revision}` resumes its claims)"):
            if disable_claims(conn, registration, revision, recorded_by=operator()):
                click.echo(f"{registration}@{revision}: work item claims and reclaims are disabled")
            receipt = fence(conn, registration, revision, recorded_by=operator())
    click.echo(f"{registration}@{revision} is Event-owned: {receipt.proof['fenced_items']} work items fenced "
               f"(fence {receipt.receipt_id}); run its Event path (`queue event-drain {registration} {revision}`)")


@queue.command("recutover")
@click.argument("registration")
@click.argument("revision", type=int)
@click.option("--route", "routes", multiple=True, help="ROUTE_ID=VERSION to bind (default: the bound versions).")
def recutover_cmd(registration: str, revision: int, routes: tuple[str, ...]) -> None:
    """Hand an Event-owned generation back to work item claims: stop its Event admission, then
    cut it over once its Event path has drained and every fenced item is reconciled."""
    from nexus_pipelines.workqueue.generations import (
        GenerationGateError,
        activate,
        bound_route_versions,
        drain_status,
        quiesce,
    )
    from nexus_pipelines.workqueue.states import ACTIVE, EVENT_PATH, WORK_ITEM_PATH

    with control_connection() as conn:
        _known_generation(conn, registration, revision)
        status = drain_status(conn, registration, revision)
        if status.claim_path != EVENT_PATH:
            raise UserError(f"re-cutover refused: {registration}@{revision} is not Event-owned "
                            f"({status.status or 'never activated'})")
        with _gate("re-cutover refused", (GenerationGateError,),
                   f"the cutover was rolled back (`queue activate {registration} {revision} --event-path` "
                   "resumes its Event path)"):
            if status.status == ACTIVE:
                quiesce(conn, registration, revision, recorded_by=operator())
                click.echo(f"{registration}@{revision}: Event path admission stopped")
            versions = _route_versions(routes) or bound_route_versions(conn, registration, revision)
            receipt = activate(conn, registration, revision, recorded_by=operator(), route_versions=versions,
                               claim_path=WORK_ITEM_PATH)
    cutover = receipt.proof.get("cutover", {})
    click.echo(f"{registration}@{revision} is active for work item claims (receipt {receipt.receipt_id}): "
               f"{cutover.get('reconciled', 0)} fenced items reconciled, "
               f"{cutover.get('materialized_work_items', 0)} new work items")


@queue.group("fences", invoke_without_command=True)
@click.option("--registration", default=None, help="Only this connector registration.")
@click.pass_context
def fences_cmd(ctx: click.Context, registration: str | None) -> None:
    """Rollback fences: what each fenced set still waits for."""
    if ctx.invoked_subcommand is not None:
        return
    from nexus_pipelines.workqueue.legacy_outcomes import fences

    with control_connection() as conn:
        rows = fences(conn, registration_id=registration)
    if not rows:
        click.echo("no rollback fences")
    for f in rows:
        click.echo(f"fence {f.fence_id}\t{f.registration_id}@{f.revision} ({f.claim_path}, {f.status})"
                   f"\tfenced={f.fenced_items}\tawaiting={f.awaiting}\tunknown={f.unknown}"
                   f"\treconciled={f.reconciled}\t{f.recorded_at:%Y-%m-%d %H:%M:%S}")


@fences_cmd.command("confirm")
@click.argument("work_id", type=int)
@click.option("--outcome", type=click.Choice(["succeeded", "failed"]), required=True,
              help="What the operator established the unknown attempt did.")
def confirm_cmd(work_id: int, outcome: str) -> None:
    """Confirm the outcome of an Event execution whose outcome is unknown (quarantined)."""
    from nexus_pipelines.workqueue.event_path import ConfirmRefused, confirm
    from nexus_pipelines.workqueue.legacy_outcomes import ConflictingOutcome

    with control_connection() as conn:
        try:
            receipt, reconciled = confirm(conn, work_id, outcome, recorded_by=operator())
        except (ConfirmRefused, ConflictingOutcome) as exc:
            raise UserError(f"confirmation refused: {exc}") from exc
    click.echo(f"work {work_id}: outcome {outcome} confirmed (receipt version {receipt.version}); "
               f"{reconciled} fenced items reconciled")


@queue.command("quiesce")
@click.argument("registration")
@click.argument("revision", type=int)
def quiesce_cmd(registration: str, revision: int) -> None:
    """Stop new claims for a generation; records the drain proof once its leases reach zero."""
    from nexus_pipelines.workqueue.generations import GenerationGateError, quiesce, record_drained

    with control_connection() as conn:
        _known_generation(conn, registration, revision)
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
