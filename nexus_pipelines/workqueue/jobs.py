"""Dagster jobs: WorkItem drain, Event-path executor, receipt router and health observation.

The drain and the Event-path executor run handlers from the same registry factory, so
a generation runs the same code whichever claim path owns it.
"""


import time
from collections.abc import Callable, Mapping
from datetime import timedelta

from dagster import Config, OpExecutionContext, Out, job, op
from psycopg_pool import ConnectionPool
from pydantic import Field

from nexus_pipelines.control.resources import ControlPlaneResource
from nexus_pipelines.workqueue import stats
from nexus_pipelines.workqueue.assets import health_observation
from nexus_pipelines.workqueue.event_path import run_event_path
from nexus_pipelines.workqueue.handlers import HandlerRegistry
from nexus_pipelines.workqueue.receipts import Route, route_until_idle
from nexus_pipelines.workqueue.registry import build_handler_registry, build_route_table
from nexus_pipelines.workqueue.session import when_reachable
from nexus_pipelines.workqueue.worker import default_worker_id, drain

DRAIN_TAG = "nexus/queue-drain"
HEALTH_WAIT_S = 30.0  # how long the closing health read waits for the control plane
EVENT_PATH_TAG = "nexus/event-path"
ROUTER_TAG = "nexus/receipt-router"


class DrainConfig(Config):
    queue_classes: list[str] | None = Field(default=None, description="Queue classes to drain; all when unset.")
    registration_ids: list[str] | None = Field(default=None, description="Registrations to drain; all when unset.")
    max_items: int = Field(default=10_000, ge=1, description="Stop claiming after this many items.")
    time_budget_s: float = Field(default=300.0, gt=0, description="Stop claiming after this many seconds.")
    concurrency: int = Field(default=4, ge=1, le=64, description="Handlers running at once (one scanner).")
    claim_batch: int = Field(default=100, ge=1, le=1000, description="Items claimed per statement.")
    lease_ttl_s: float = Field(default=60.0, gt=0, description="Lease length; renewed while handlers run.")


class EventPathConfig(Config):
    registration_id: str = Field(description="The Event-owned generation's registration.")
    revision: int = Field(ge=0, description="The Event-owned generation's revision.")
    max_items: int = Field(default=10_000, ge=1, description="Stop starting work after this many executions.")
    time_budget_s: float = Field(default=300.0, gt=0, description="Stop starting work after this many seconds.")
    lease_ttl_s: float = Field(default=60.0, gt=0, description="Scheduler lease length; renewed while it runs.")


class RouterConfig(Config):
    batch: int = Field(default=500, ge=1, le=1000, description=(
        "Receipts claimed per statement (the CLI and the local stack route 500 at a time too)."))
    max_receipts: int = Field(default=5_000, ge=1)
    time_budget_s: float = Field(default=120.0, gt=0)
    lease_ttl_s: float = Field(default=60.0, gt=0)


def build_drain_job(
    registry_factory: Callable[[ConnectionPool], HandlerRegistry] = build_handler_registry,
    *,
    name: str = "workqueue_drain",
):
    @op(name=f"{name}_op", out=Out(dict), description="Claim and run due work items until a budget is spent.")
    def drain_op(context: OpExecutionContext, config: DrainConfig, control_plane: ControlPlaneResource) -> dict:
        worker_id = f"dagster:{context.run_id[:8]}:{default_worker_id()}"
        # A drain launched during an outage waits for the control plane within its budget.
        deadline = time.monotonic() + config.time_budget_s
        pool = when_reachable(control_plane.pool, give_up_at=deadline, on_outage=context.log.warning,
                              name=f"drain {worker_id}")
        registry = registry_factory(pool)
        context.log.info(
            f"draining work types {registry.work_types or '(none registered)'} "
            f"queue classes {config.queue_classes or 'all'} as {worker_id}"
        )
        report = drain(
            pool,
            registry,
            on_outage=context.log.warning,
            worker_id=worker_id,
            queue_classes=config.queue_classes,
            registration_ids=config.registration_ids,
            max_items=config.max_items,
            time_budget_s=max(deadline - time.monotonic(), 0.001),
            claim_batch=config.claim_batch,
            concurrency=config.concurrency,
            lease_ttl_s=config.lease_ttl_s,
        )
        context.log.info(
            f"drain stopped ({report.stopped}): claimed {report.claimed}, completed {report.completed}, "
            f"retried {report.retried}, dead {report.dead}, lost {report.lost}, "
            f"reclaimed {report.reclaimed_retry + report.reclaimed_dead}{_outages(report)}"
        )
        return _observe(context, control_plane, report.as_dict(), "last_drain")

    @job(name=name, tags={DRAIN_TAG: "drain"}, description="Drain the durable connector work queue.")
    def drain_job():
        drain_op()

    return drain_job


def _outages(report) -> str:
    if not report.outages:
        return ""
    return f"; the control plane was unreachable {report.outages} time(s), {report.outage_s:.1f}s in all"


def _observe(context: OpExecutionContext, control_plane: ControlPlaneResource, summary: dict, key: str) -> dict:
    def read_health():
        # a pooled connection may have died in an outage the run just waited out: another is asked for
        with control_plane.connection() as conn:
            return stats.queue_health(conn, include_totals=False)

    health = when_reachable(read_health, give_up_at=time.monotonic() + HEALTH_WAIT_S, on_outage=context.log.warning)
    context.log_event(health_observation(health, **{key: summary}))
    context.add_output_metadata({k: v for k, v in summary.items() if isinstance(v, (int, float, str))})
    return summary


def build_event_path_job(
    registry_factory: Callable[[ConnectionPool], HandlerRegistry] = build_handler_registry,
    *,
    name: str = "workqueue_event_path",
):
    @op(name=f"{name}_op", out=Out(dict),
        description="Run an Event-owned generation's work in delivery order under its scheduler lease.")
    def event_path_op(context: OpExecutionContext, config: EventPathConfig, control_plane: ControlPlaneResource) -> dict:
        registry = registry_factory(control_plane.pool())
        worker_id = f"dagster:{context.run_id[:8]}:{default_worker_id()}"
        generation = f"{config.registration_id}@{config.revision}"
        context.log.info(f"running the Event path of {generation} with work types {registry.work_types} as {worker_id}")
        report = run_event_path(
            control_plane.pool(), registry, config.registration_id, config.revision, worker_id=worker_id,
            max_items=config.max_items, time_budget_s=config.time_budget_s, lease_ttl_s=config.lease_ttl_s,
            on_outage=context.log.warning,
        )
        context.log.info(
            f"Event path of {generation} stopped ({report.stopped}): started {report.claimed}, succeeded "
            f"{report.completed}, retried {report.retried}, failed {report.dead}, unknown {report.unknown}, "
            f"reconciled {report.reconciled}{_outages(report)}"
        )
        return _observe(context, control_plane, report.as_dict(), "last_event_path")

    @job(name=name, tags={EVENT_PATH_TAG: "event-path"},
         description="Run the Event path (one ordered consumer) of an Event-owned generation.")
    def event_path_job():
        event_path_op()

    return event_path_job


def build_router_job(
    routes_factory: Callable[[], Mapping[str, Route]] = build_route_table, *, name: str = "workqueue_receipt_router"
):
    @op(name=f"{name}_op", out=Out(dict), description="Route due ingress receipts into events and work items.")
    def router_op(context: OpExecutionContext, config: RouterConfig, control_plane: ControlPlaneResource) -> dict:
        routes = routes_factory()
        owner = f"dagster:{context.run_id[:8]}:{default_worker_id()}"
        total = route_until_idle(control_plane.pool(), routes, owner=owner, batch=config.batch,
                                 max_receipts=config.max_receipts, time_budget_s=config.time_budget_s,
                                 lease_ttl=timedelta(seconds=config.lease_ttl_s))
        context.log.info(f"routed receipts: {total.as_dict()}")
        return _observe(context, control_plane, total.as_dict(), "last_router")

    @job(name=name, tags={ROUTER_TAG: "router"}, description="Route ingress receipts of the work queue.")
    def router_job():
        router_op()

    return router_job


@op(out=Out(dict), description="Record queue health as an observation of workqueue/health.")
def workqueue_health_op(context: OpExecutionContext, control_plane: ControlPlaneResource) -> dict:
    with control_plane.connection() as conn:
        health = stats.queue_health(conn)
    context.log_event(health_observation(health))
    return health


@job(name="workqueue_health", description="Observe work queue health.")
def workqueue_health_job():
    workqueue_health_op()
