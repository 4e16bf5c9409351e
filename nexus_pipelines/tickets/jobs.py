"""The tickets' Dagster jobs: `record_proof` (an operator records an accepted success proof
from the launchpad) and `tickets_observe` (ticket counts per registration)."""

from dagster import Config, Failure, OpExecutionContext, job, op
from pydantic import Field

from nexus_pipelines.control.resources import ControlPlaneResource
from nexus_pipelines.tickets.assets import tickets_observation
from nexus_pipelines.tickets.proofs import ProofRefused, record_proof
from nexus_pipelines.tickets.queries import counts_by_registration, ticket_detail


class RecordProofConfig(Config):
    ticket_id: int = Field(gt=0, description="The connector ticket whose project work succeeded.")
    evidence: str = Field(min_length=1, max_length=2000, description="What proves success (release, link, test).")
    recorded_by: str = Field(min_length=1, max_length=100, description="Who accepts the proof.")
    client_request_id: str = Field(default="", description="Idempotency key; the run id when empty.")


@op(description="Record an accepted success proof; creates the ticket's one close command and its issue.close work.")
def record_proof_op(context: OpExecutionContext, config: RecordProofConfig, control_plane: ControlPlaneResource):
    with control_plane.connection() as conn:
        try:
            result = record_proof(conn, config.ticket_id, evidence=config.evidence,
                                  recorded_by=f"dagster:{config.recorded_by}",
                                  client_request_id=config.client_request_id or f"dagster:{context.run_id}")
        except ProofRefused as exc:
            raise Failure(description=f"proof refused: {exc}") from None
        registration_id = ticket_detail(conn, config.ticket_id)["registration_id"]
        counts = counts_by_registration(conn).get(registration_id)
    context.log.info(f"ticket {result.ticket_id}: proof {result.proof_id}, close command {result.command_id} "
                     f"({'recorded' if result.created else 'already recorded'}); a drain run closes the issue")
    context.log_event(tickets_observation(registration_id, counts))


@job(name="record_proof", description="Record an accepted success proof for a connector ticket.")
def record_proof_job():
    record_proof_op()


@op(description="Observe ticket counts of every connector registration.")
def tickets_observe_op(context: OpExecutionContext, control_plane: ControlPlaneResource) -> None:
    with control_plane.connection() as conn:
        counts = counts_by_registration(conn)
    for rid, value in sorted(counts.items()):
        context.log_event(tickets_observation(rid, value))


@job(name="tickets_observe", description="Record ticket counts per registration as asset observations.")
def tickets_observe_job():
    tickets_observe_op()
