"""The work queue's Dagster definitions, built with the code location's registries."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from dagster import Definitions, ScheduleDefinition
from psycopg_pool import ConnectionPool

from nexus_pipelines.workqueue.assets import workqueue_health_spec
from nexus_pipelines.workqueue.handlers import HandlerRegistry
from nexus_pipelines.workqueue.jobs import (
    build_drain_job,
    build_event_path_job,
    build_router_job,
    workqueue_health_job,
)
from nexus_pipelines.workqueue.receipts import Route
from nexus_pipelines.workqueue.registry import QUEUE_CLASSES, build_handler_registry, build_route_table
from nexus_pipelines.workqueue.sensors import build_drain_sensor, build_event_path_sensor, build_router_sensor


def build_workqueue_defs(
    registry_factory: Callable[[ConnectionPool], HandlerRegistry] = build_handler_registry,
    routes_factory: Callable[[], Mapping[str, Route]] = build_route_table,
    queue_classes: Sequence[str] = QUEUE_CLASSES,
) -> Definitions:
    drain_job = build_drain_job(registry_factory)
    event_path_job = build_event_path_job(registry_factory)  # the same handlers on either claim path
    router_job = build_router_job(routes_factory)
    return Definitions(
        assets=[workqueue_health_spec],
        jobs=[drain_job, event_path_job, router_job, workqueue_health_job],
        sensors=[build_drain_sensor(drain_job, queue_classes), build_event_path_sensor(event_path_job),
                 build_router_sensor(router_job)],
        schedules=[
            ScheduleDefinition(
                name="workqueue_health_every_5_minutes", job=workqueue_health_job, cron_schedule="*/5 * * * *"
            )
        ],
    )
