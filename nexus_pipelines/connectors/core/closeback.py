"""Deterministic close commands (docs/design/connector-contract.md, "Close-back"): one per accepted success proof.

The command id and marker are pure functions of (tenant, ticket id, proof id), so
recording the same proof twice, replaying a work item or recovering from a crash
always derives the same command, and the provider thread is searched for the same
exact marker. The comment is derived from the proof; its text goes through the
redaction rule because an operator typed it.
"""

from __future__ import annotations

import hashlib

from nexus_pipelines.connectors.core.values import COMMENT_MAX_CHARS
from nexus_pipelines.redaction import one_line

EVIDENCE_MAX_CHARS = 2000


def command_id(tenant: str, ticket_id: int, proof_id: int) -> str:
    digest = hashlib.sha256(f"{tenant}\x1f{ticket_id}\x1f{proof_id}".encode()).hexdigest()[:32]
    return f"close-{digest}"


def marker(command: str) -> str:
    return f"[nexus:close:{command.removeprefix('close-')}]"


def close_comment(*, ticket_id: int, proof_id: int, evidence: str, recorded_by: str, command: str) -> str:
    """The marker-bearing comment posted before the issue is closed."""
    text = (
        f"Closed by nexus_pipelines: ticket {ticket_id} has an accepted success proof "
        f"(proof {proof_id}, recorded by {one_line(recorded_by, 100)}).\n\n"
        f"{one_line(evidence, EVIDENCE_MAX_CHARS)}\n\n"
        f"{marker(command)}"
    )
    assert len(text) <= COMMENT_MAX_CHARS
    return text
