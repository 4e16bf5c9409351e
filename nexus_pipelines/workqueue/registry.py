"""The work queue's empty registries, the defaults of its jobs, sensors and CLI.

The code location binds the real ones (`nexus_pipelines/bindings.py`): work types with
their handlers, receipt routes and queue classes of the domains that use the queue.
`workqueue/` never imports those domains; its jobs take the factories as arguments.
A handler registry factory receives the control-plane pool, since handlers write
their effects to the control plane under the item's fence.
"""

from __future__ import annotations

from psycopg_pool import ConnectionPool

from nexus_pipelines.workqueue.handlers import HandlerRegistry
from nexus_pipelines.workqueue.receipts import Route

QUEUE_CLASSES: tuple[str, ...] = ("default",)


def build_handler_registry(pool: ConnectionPool | None = None) -> HandlerRegistry:
    return HandlerRegistry({})


def build_route_table() -> dict[str, Route]:
    return {}
