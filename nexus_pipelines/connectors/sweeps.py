"""The static table of reconciliation-sweep sources: one reviewed row per connector kind, each
wrapping that kind's composed adapter (its client, credential and strict mapping)."""

from __future__ import annotations

from collections.abc import Callable

from nexus_pipelines.connectors.core.registration import Registration
from nexus_pipelines.connectors.core.sweep import SourceFor
from nexus_pipelines.connectors.core.sweep_values import SweepSource
from nexus_pipelines.connectors.core.tick import Composer
from nexus_pipelines.connectors.github.sweep import sweep_source as github_source
from nexus_pipelines.connectors.gitlab.sweep import sweep_source as gitlab_source
from nexus_pipelines.connectors.jira.sweep import sweep_source as jira_source

SWEEP_SOURCES: dict[str, Callable[..., SweepSource]] = {
    "gitlab": gitlab_source,
    "github": github_source,
    "jira": jira_source,
}


def sources(compose: Composer) -> SourceFor:
    """The sweep source of a registration, over the adapter `compose` gives it."""
    def source_for(registration: Registration) -> SweepSource:
        return SWEEP_SOURCES[registration.kind](compose(registration))

    return source_for
