"""Dagster jobs: drain, receipt router and health observation."""


import time
from collections.abc import Callable, Mapping
from datetime import timedelta

from dagster import Config, OpExecutionContext, Out, job, op
from psycopg_pool import ConnectionPool
from pydantic import Field

from nexus_pipelines.control.resources import ControlPlaneResource
from nexus_pipelines.workqueue import stats
from nexus_pipelines.workqueue.assets import health_observation
from nexus_pipelines.workqueue.handlers import HandlerRegistry
from nexus_pipelines.workqueue.receipts import Route, RouterReport, route_receipts
from nexus_pipelines.workqueue.registry import build_handler_registry, build_route_table
from nexus_pipelines.workqueue.worker import default_worker_id, drain

DRAIN_TAG = "nexus/queue-drain"
ROUTER_TAG = "nexus/receipt-router"


class DrainConfig(Config):
    queue_classes: list[str] | None = Field(default=None, description="Queue classes to drain; all when unset.")
    registration_ids: list[str] | None = Field(default=None, description="Registrations to drain; all when unset.")
    max_items: int = Field(default=10_000, ge=1, description="Stop claiming after this many items.")
    time_budget_s: float = Field(default=300.0, gt=0, description="Stop claiming after this many seconds.")
    concurrency: int = Field(default=4, ge=1, le=64, description="Handlers running at once (one scanner).")
    claim_batch: int = Field(default=100, ge=1, le=1000, description="Items claimed per statement.")
    lease_ttl_s: float = Field(default=60.0, gt=0, description="Lease length; renewed while handlers run.")


class RouterConfig(Config):
    batch: int = Field(default=50, ge=1, le=1000, description="Receipts claimed per statement.")
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
        registry = registry_factory(control_plane.pool())
        worker_id = f"dagster:{context.run_id[:8]}:{default_worker_id()}"
        context.log.info(
            f"draining work types {registry.work_types or '(none registered)'} "
            f"queue classes {config.queue_classes or 'all'} as {worker_id}"
        )
        report = drain(
            control_plane.pool(),
            registry,
            worker_id=worker_id,
            queue_classes=config.queue_classes,
            registration_ids=config.registration_ids,
            max_items=config.max_items,
            time_budget_s=config.time_budget_s,
            claim_batch=config.claim_batch,
            concurrency=config.concurrency,
            lease_ttl_s=config.lease_ttl_s,
        )
        summary = report.as_dict()
        context.log.info(
            f"drain stopped ({report.stopped}): claimed {report.claimed}, completed {report.completed}, "
            f"retried {report.retried}, dead {report.dead}, lost {report.lost}, "
            f"reclaimed {report.reclaimed_retry + report.reclaimed_dead}"
        )
        with control_plane.connection() as conn:
            health = stats.queue_health(conn, include_totals=False)
        context.log_event(health_observation(health, last_drain=summary))
        context.add_output_metadata({k: v for k, v in summary.items() if isinstance(v, (int, float, str))})
        return summary

    @job(name=name, tags={DRAIN_TAG: "drain"}, description="Drain the durable connector work queue.")
    def drain_job():
        drain_op()

    return drain_job


def build_router_job(
    routes_factory: Callable[[], Mapping[str, Route]] = build_route_table, *, name: str = "workqueue_receipt_router"
):
    @op(name=f"{name}_op", out=Out(dict), description="Route due ingress receipts into events and work items.")
    def router_op(context: OpExecutionContext, config: RouterConfig, control_plane: ControlPlaneResource) -> dict:
        routes = routes_factory()
        owner = f"dagster:{context.run_id[:8]}:{default_worker_id()}"
        total = RouterReport()
        deadline = time.monotonic() + config.time_budget_s
        with control_plane.connection() as conn:
            while total.claimed < config.max_receipts and time.monotonic() < deadline:
                report = route_receipts(
                    conn, routes, owner=owner, limit=config.batch, lease_ttl=timedelta(seconds=config.lease_ttl_s)
                )
                for key, value in report.as_dict().items():
                    setattr(total, key, getattr(total, key) + value)
                if report.claimed == 0:
                    break
            health = stats.queue_health(conn, include_totals=False)
        context.log.info(f"routed receipts: {total.as_dict()}")
        context.log_event(health_observation(health, last_router=total.as_dict()))
        context.add_output_metadata(total.as_dict())
        return total.as_dict()

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
