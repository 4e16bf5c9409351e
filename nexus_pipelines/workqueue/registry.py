"""The code location's explicit registries for the work queue.

Domains add their work types here (work type -> handler), their receipt routes
(route key -> Route) and the queue classes the drain sensor watches. Nothing is
discovered dynamically.
"""

from __future__ import annotations

from nexus_pipelines.workqueue.handlers import Handler, HandlerRegistry
from nexus_pipelines.workqueue.receipts import Route

HANDLERS: dict[str, Handler] = {}
ROUTES: dict[str, Route] = {}
QUEUE_CLASSES: tuple[str, ...] = ("default",)


def build_handler_registry() -> HandlerRegistry:
    return HandlerRegistry(HANDLERS)


def build_route_table() -> dict[str, Route]:
    return dict(ROUTES)
