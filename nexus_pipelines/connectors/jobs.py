"""The connectors' Dagster job: the poll run. What it reports about tickets comes from its
`ticket_observer` resource (bound by the code location), so connectors never import tickets."""

import os
import socket
import uuid

from dagster import Config, Failure, MetadataValue, OpExecutionContext, Out, job, op
from pydantic import Field

from nexus_pipelines.connectors.core.compose import CachedComposer
from nexus_pipelines.connectors.provider_gate import ProviderGates
from nexus_pipelines.connectors.core.executor import RetryExecutor
from nexus_pipelines.connectors.core.registry import ComposeContext
from nexus_pipelines.connectors.core.tick import TickReport, poll
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.integrations.http import CallCounter

POLL_TAG = "nexus/connector-poll"


class PollConfig(Config):
    registrations: list[str] | None = Field(
        default=None, description="Registration ids (tenant/key) to poll; every due registration when unset.")
    max_ticks: int = Field(default=1000, ge=1, description="At most this many pages (one per tick).")
    time_budget_s: float = Field(default=240.0, gt=0, description="Stop claiming ticks after this many seconds.")


def _tick_line(tick: TickReport) -> str:
    if tick.outcome == "page":
        return (f"{tick.revision_id}: {tick.issues} issues ({tick.admitted} new versions, "
                f"{tick.issues - tick.admitted} unchanged, {tick.excluded} excluded), "
                f"{'a shift under the scan: it repeats from its bound, ' if tick.rescan else ''}"
                f"{'scan complete' if tick.exhausted else 'more pages'}, cursor {(tick.cursor or '')[:100]}")
    return f"{tick.revision_id}: {tick.outcome} {tick.failure} (next poll in {tick.retry_in_s}s)"


@op(out=Out(dict), required_resource_keys={"control_plane", "ticket_observer"},
    description="Poll due connector registrations, one bounded page per fenced tick.")
def connectors_poll_op(context: OpExecutionContext, config: PollConfig) -> dict:
    counter = CallCounter()
    composer = CachedComposer(REGISTRY, ComposeContext(counter=counter, gates=ProviderGates(context.resources.control_plane.pool())))
    owner = f"dagster:{context.run_id[:8]}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    try:
        with context.resources.control_plane.connection() as conn:
            report = poll(conn, REGISTRY, composer, owner=owner, executor=RetryExecutor(),
                          registration_ids=config.registrations, max_ticks=config.max_ticks,
                          time_budget_s=config.time_budget_s, on_tick=lambda t: context.log.info(_tick_line(t)))
            new_tickets, observations = context.resources.ticket_observer.after_poll(conn, report.ticks)
    finally:
        composer.close()
    totals = {**report.totals, "new_tickets": new_tickets, "ticket_updates": report.totals["admitted"] - new_tickets,
              "api_calls": counter.total()}
    for observation in observations:
        context.log_event(observation)
    cursors = {t.registration_id: t.cursor for t in report.ticks if t.cursor}
    metadata = {**{k: MetadataValue.int(v) for k, v in totals.items()}, "stopped": MetadataValue.text(report.stopped),
                "cursor_position": MetadataValue.json(cursors)}
    context.log.info(f"poll stopped ({report.stopped}): {totals}")
    terminal = [t for t in report.ticks if t.failure_class == "terminal"]
    if terminal:
        raise Failure(description="; ".join(f"{t.revision_id} {t.failure}" for t in terminal)[:1000],
                      metadata=metadata)
    context.add_output_metadata(metadata)
    return {"totals": totals, "stopped": report.stopped}


@job(name="connectors_poll", tags={POLL_TAG: "poll"}, description="Poll connector registrations for issues.")
def connectors_poll_job():
    connectors_poll_op()
