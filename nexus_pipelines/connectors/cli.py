"""`nexus-pipelines connectors ...`: registrations, their poll state, manual polls, activation."""

from __future__ import annotations

import json

import click

from nexus_pipelines.cli_common import UserError, control_connection, control_dsn, operator


def _registrations(*, at_least_one: bool = False):
    from nexus_pipelines.connectors.core.registration import RegistrationError
    from nexus_pipelines.connectors.registry import load_registrations, registrations_dir, why_empty

    try:
        found = load_registrations()
    except RegistrationError as exc:
        raise UserError(str(exc)) from None
    if at_least_one and not found:
        raise UserError(why_empty(registrations_dir()))
    return found


def _select(keys: tuple[str, ...], *, everything: bool = False):
    from nexus_pipelines.connectors.registry import registrations_dir

    found = _registrations(at_least_one=everything or not keys)
    if everything or not keys:
        return list(found.values())
    chosen = []
    for key in keys:
        matches = [r for rid, r in found.items() if key in (rid, r.key)]
        if len(matches) != 1:
            known = ", ".join(sorted(found)) or "none"
            raise UserError(f"no single registration named {key!r} in {registrations_dir()} (known: {known})")
        chosen.append(matches[0])
    return chosen


@click.group("connectors")
def connectors() -> None:
    """Connector registrations: list, poll state, manual polls, activation of revisions."""


@connectors.command("list")
def list_cmd() -> None:
    """The registration files, their revision and the permission each needs."""
    from nexus_pipelines.connectors.registry import REGISTRY

    for registration in _registrations(at_least_one=True).values():
        click.echo(f"{registration.registration_id}\t{registration.kind}\t{registration.revision_id}\t"
                   f"project={registration.project}\tpoll every {registration.poll_interval_seconds}s\t"
                   f"needs: {REGISTRY[registration.kind].permissions}")


@connectors.command("status")
@click.argument("keys", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines.")
def status_cmd(keys: tuple[str, ...], as_json: bool) -> None:
    """Revisions with their cursor, schedule, failures and ticket counts."""
    from nexus_pipelines.bindings import ticket_counts
    from nexus_pipelines.connectors.core import store

    ids = [r.registration_id for r in _select(keys)] if keys else None
    with control_connection() as conn:
        views = store.progress(conn, ids)
        counts = ticket_counts(conn)
    if not views:
        click.echo("no registration revision is registered yet: run `nexus-pipelines connectors activate`")
    for view in views:
        c = counts.get(view.registration_id)
        row = {**view.__dict__, "tickets": c.__dict__ if c else None}
        if as_json:
            click.echo(json.dumps(row, default=str, sort_keys=True))
            continue
        tickets = f"tickets {c.total} ({c.untriaged} untriaged, {c.closed} closed at source)" if c else "no tickets"
        failure = f"  failing x{view.failure_count}: {view.last_failure}" if view.failure_count else ""
        click.echo(f"{view.registration_id} rev {view.revision_no} {view.revision_id} [{view.status}] "
                   f"{'leased ' if view.leased else ''}next poll {view.next_poll_at:%Y-%m-%d %H:%M:%S}Z, "
                   f"{view.pages} pages, {view.issues_delivered} issue versions, {tickets}{failure}")
        if view.cursor:
            click.echo(f"    cursor {view.cursor[:160]}")


@connectors.command("activate")
@click.argument("keys", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Every registration in configs/connectors/.")
def activate_cmd(keys: tuple[str, ...], everything: bool) -> None:
    """Make each registration file's current revision the polling one (the old revision drains first)."""
    from nexus_pipelines.bindings import build_handler_registry, build_route_table, route_versions
    from nexus_pipelines.connectors.core.activation import ActivationRefused, activate
    from nexus_pipelines.connectors.registry import REGISTRY
    from nexus_pipelines.control.db import make_pool
    from nexus_pipelines.workqueue.generations import GenerationGateError
    from nexus_pipelines.workqueue.receipts import route_until_idle
    from nexus_pipelines.workqueue.worker import drain

    if not keys and not everything:
        raise UserError("name the registrations to activate, or pass --all")
    with control_connection() as conn:
        pool = make_pool(control_dsn(), max_size=4)  # conn.info.dsn leaves the password out

        def drain_old(registration_id: str, revision: int) -> None:
            route_until_idle(pool, build_route_table(), owner=operator())
            drain(pool, build_handler_registry(pool), registration_ids=[registration_id], time_budget_s=120)

        try:
            for registration in _select(keys, everything=everything):
                try:
                    result = activate(conn, registration, REGISTRY, recorded_by=operator(),
                                      route_versions=route_versions(), drain_old=drain_old)
                except (ActivationRefused, GenerationGateError) as exc:
                    raise UserError(f"{registration.registration_id}: {exc}") from None
                if result.already_active:
                    click.echo(f"{result.registration_id}: revision {result.revision_no} ({result.revision_id}) "
                               "is already active")
                    continue
                retired = f", retired {', '.join(result.retired)}" if result.retired else ""
                dead = f"; {result.dead_left_behind} dead work items of the old revision stay in the DLQ" \
                    if result.dead_left_behind else ""
                click.echo(f"{result.registration_id}: revision {result.revision_no} ({result.revision_id}) is "
                           f"active and polls from its own cursor{retired}{dead}")
        finally:
            pool.close()


@connectors.command("poll")
@click.argument("keys", nargs=-1)
@click.option("--max-ticks", default=1000, type=click.IntRange(1), help="At most this many pages.")
@click.option("--time-budget", "time_budget_s", default=120.0, type=click.FloatRange(0, min_open=True))
def poll_cmd(keys: tuple[str, ...], max_ticks: int, time_budget_s: float) -> None:
    """Poll now (every active registration, or those named) and route what arrived."""
    from nexus_pipelines.bindings import build_route_table
    from nexus_pipelines.cli_common import operator as owner
    from nexus_pipelines.connectors.core import store
    from nexus_pipelines.connectors.core.compose import CachedComposer
    from nexus_pipelines.connectors.core.executor import RetryExecutor
    from nexus_pipelines.connectors.core.registry import ComposeContext
    from nexus_pipelines.connectors.core.tick import poll
    from nexus_pipelines.connectors.provider_gate import ProviderGates
    from nexus_pipelines.connectors.registry import REGISTRY
    from nexus_pipelines.control.db import make_pool
    from nexus_pipelines.workqueue.receipts import route_until_idle

    ids = [r.registration_id for r in _select(keys)] if keys else None
    with control_connection() as conn:
        pool = make_pool(control_dsn(), max_size=2)  # the provider gates (shared with every process), then the router
        composer = CachedComposer(REGISTRY, ComposeContext(gates=ProviderGates(pool)))
        try:
            requested = store.request_poll(conn, ids)
            if not requested:
                raise UserError("no active registration revision to poll: run `nexus-pipelines connectors activate`")
            for held in (r for r in requested if r.held_until is not None):
                click.echo(held.line())
            report = poll(conn, REGISTRY, composer, owner=owner(), executor=RetryExecutor(), registration_ids=ids,
                          max_ticks=max_ticks, time_budget_s=time_budget_s)
            routed = route_until_idle(pool, build_route_table(), owner=owner()).materialized
        finally:
            composer.close()
            pool.close()
    for tick in report.ticks:
        if tick.outcome != "page":
            click.echo(f"{tick.revision_id}: {tick.outcome}: {tick.failure} (next poll in {tick.retry_in_s}s)")
    t = report.totals
    click.echo(f"polled {t['pages']} pages: {t['issues_seen']} issues, {t['admitted']} new versions, "
               f"{t['unchanged']} unchanged, {t['excluded']} excluded, {t['failures']} failed ticks; routed {routed} "
               "receipts (run `nexus-pipelines queue drain` to apply them)")
    if any(tick.failure_class == "terminal" for tick in report.ticks):
        raise SystemExit(1)


@connectors.command("sweep")
@click.option("--key", "keys", multiple=True, help="Registration key or tenant/key (repeatable); every one when unset.")
@click.option("--max-pages", default=2000, type=click.IntRange(1), help="At most this many listing pages each.")
@click.option("--time-budget", "time_budget_s", default=1800.0, type=click.FloatRange(0, min_open=True))
def sweep_cmd(keys: tuple[str, ...], max_pages: int, time_budget_s: float) -> None:
    """Reconcile: list the provider's issues, compare them with custody, re-observe every gap."""
    from contextlib import closing

    from nexus_pipelines.bindings import build_route_table
    from nexus_pipelines.cli_common import operator as owner
    from nexus_pipelines.connectors.core.compose import CachedComposer, CompositionError
    from nexus_pipelines.connectors.core.executor import RetryExecutor
    from nexus_pipelines.connectors.core.sweep import SweepBounds, sweep
    from nexus_pipelines.connectors.registry import REGISTRY
    from nexus_pipelines.connectors.sweeps import sources
    from nexus_pipelines.control.db import make_pool
    from nexus_pipelines.workqueue.receipts import route_until_idle

    composer = CachedComposer(REGISTRY)
    failed = False
    try:
        with control_connection() as conn:
            for registration in _select(keys):
                try:
                    report = sweep(conn, REGISTRY, registration, sources(composer), owner=owner(),
                                   executor=RetryExecutor(),
                                   bounds=SweepBounds(max_pages=max_pages, time_budget_s=time_budget_s))
                except CompositionError as exc:
                    raise UserError(str(exc)) from None
                failed |= report.outcome in ("failed", "lease_busy", "inactive")
                click.echo(report.line())
            # the re-observed gaps reach their work items (`nexus-pipelines queue drain` applies them)
            with closing(make_pool(control_dsn(), max_size=2)) as pool:
                route_until_idle(pool, build_route_table(), owner=owner())
    finally:
        composer.close()
    if failed:
        raise SystemExit(1)
