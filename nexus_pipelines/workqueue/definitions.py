"""The work queue's Dagster definitions (no resources: they come from the code location)."""

from __future__ import annotations

from dagster import Definitions, ScheduleDefinition

from nexus_pipelines.workqueue.assets import workqueue_health_spec
from nexus_pipelines.workqueue.jobs import workqueue_drain_job, workqueue_health_job, workqueue_router_job
from nexus_pipelines.workqueue.sensors import workqueue_drain_sensor, workqueue_router_sensor

workqueue_health_schedule = ScheduleDefinition(
    name="workqueue_health_every_5_minutes", job=workqueue_health_job, cron_schedule="*/5 * * * *"
)

workqueue_defs = Definitions(
    assets=[workqueue_health_spec],
    jobs=[workqueue_drain_job, workqueue_router_job, workqueue_health_job],
    sensors=[workqueue_drain_sensor, workqueue_router_sensor],
    schedules=[workqueue_health_schedule],
)
