"""The explicit name-to-job registry (docs/design/writeback-run.md, "Job contract and replay
options"): no dynamic imports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nexus_pipelines.settings import PROJECT_ROOT, load_settings
from nexus_pipelines.writeback.jobs.month_end_arr import MonthEndArrMapper
from nexus_pipelines.writeback.mapping import Mapper


@dataclass(frozen=True)
class JobDefinition:
    name: str
    description: str
    mapper_factory: Callable[[], Mapper]
    config_path: Path  # the production config; `run-job --config` may point elsewhere
    local_config_path: Path  # the embedded stack's variant (the NexusCRM simulator on loopback)

    def mapper(self) -> Mapper:
        return self.mapper_factory()

    def default_config(self) -> Path:
        """The config a run uses when none is named: the local one only on the local stack."""
        return self.local_config_path if load_settings().local_stack else self.config_path


JOBS: dict[str, JobDefinition] = {
    "month_end_arr": JobDefinition(
        name="month_end_arr",
        description="Month End ARR per account and month -> NexusCRM Month_End_ARR__c",
        mapper_factory=MonthEndArrMapper,
        config_path=PROJECT_ROOT / "configs" / "jobs" / "month_end_arr.yaml",
        local_config_path=PROJECT_ROOT / "configs" / "jobs" / "month_end_arr.local.yaml",
    ),
}

for _definition in JOBS.values():
    _definition.mapper_factory().check_declaration()


class UnknownJob(KeyError):
    pass


def get_job(name: str) -> JobDefinition:
    try:
        return JOBS[name]
    except KeyError:
        raise UnknownJob(f"unknown writeback job {name!r}; registered jobs: {', '.join(sorted(JOBS))}") from None
