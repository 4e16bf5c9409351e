"""The NexusCRM side of a writeback run as a Dagster resource.

It holds no secret: `factory()` returns a function that composes the client from the
environment variables the job config names, at run time, inside the run.
"""

from __future__ import annotations

from collections.abc import Callable

from dagster import ConfigurableResource

from nexus_pipelines.integrations.nexuscrm import NexusCrmClient
from nexus_pipelines.writeback.config import LoadedConfig
from nexus_pipelines.writeback.runner import default_crm_factory


class NexusCrmWritebackResource(ConfigurableResource):
    """Composes NexusCRM clients from the env-var names in each job config."""

    def factory(self) -> Callable[[LoadedConfig], NexusCrmClient]:
        return default_crm_factory
