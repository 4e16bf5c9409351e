"""Applying observed issue versions to tickets: exact custody and replay-safe
observations (docs/design/connector-contract.md, "Custody and observations").

The first observation of an external reference creates exactly one ticket, its custody
link, the automatic P2 priority fact, the UNTRIAGED triage fact, the unresolved
commander-owned `connector_triage_required` Attention finding and the observation, in
one transaction. An unchanged replay writes nothing (the observation is unique by
source digest); a new digest appends one observation and makes one deterministic
ticket update, unless it is older than a version already observed (then only the
observation is kept). Provider content is external and untrusted: it can change
title, description, labels and the recorded source state, never the ticket's
lifecycle, triage, priority or close eligibility.

A drain applies a batch of versions with a few set-based statements in one transaction
(`apply_observations`); versions of the same issue in one batch are applied in the given
(lane) order, each one in a later round that sees what the earlier ones wrote.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from psycopg import Connection

from nexus_pipelines.connectors.core.values import ExternalIssue, canonical_form
from nexus_pipelines.workqueue.receipts import json_array

INTAKE_ACTOR = "system:intake"
DEFAULT_PRIORITY = "P2"


@dataclass(frozen=True)
class CustodyKey:
    tenant: str
    registration_key: str
    external_ref: str


class CustodyConflict(RuntimeError):
    """A custody fact would merge or move a link; closed-world custody refuses it."""


@dataclass(frozen=True)
class IntakeResult:
    outcome: str  # created | updated | unchanged | stale
    ticket_id: int


@dataclass(frozen=True)
class Observation:
    """One issue version to apply, with the work item (and its token) that carries it."""

    key: CustodyKey
    project: str
    issue: ExternalIssue
    digest: str
    labels: list[str]
    work_id: int
    work_token: int
    # the issue's canonical JSON (what its digest is taken over), serialized once: the round's
    # document carries it as it is, and the statements read the issue's fields from it
    issue_json: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "issue_json", canonical_form(self.issue))


def apply_observations(conn: Connection, observations: Sequence[Observation]) -> list[IntakeResult]:
    """Apply issue versions, in order, inside the caller's (fenced) transaction; one result each."""
    for o in observations:
        if o.issue.external_ref != o.key.external_ref:
            raise CustodyConflict(f"an observation of {o.issue.external_ref} was routed to custody of "
                                  f"{o.key.external_ref}")
    results: list[IntakeResult | None] = [None] * len(observations)
    for round_ in _rounds(observations):
        _apply_round(conn, [(n, observations[n]) for n in round_], results)
    return results  # type: ignore[return-value] - every index belongs to one round


def plan_without_table_scans(conn: Connection) -> None:
    """Plan the rest of the caller's transaction with index scans wherever an index answers
    (call it before `apply_observations`). The five foreign-key checks of each new ticket
    (custody, facts, finding, observation -> tickets) run through plans the connection
    caches: one made while `tickets` was analyzed empty would scan it sequentially, and as a
    first sync grows the table every check would read all of it. A plan made under this
    setting probes the key whatever the statistics, so it stays right as the table grows and
    the connection keeps it. No statement of a batch reads a table whole."""
    conn.execute("SET LOCAL enable_seqscan = off")


def _rounds(observations: Sequence[Observation]) -> list[list[int]]:
    """Indexes split so no round holds one custody key twice: the k-th version of an issue goes
    to round k, so later versions see the effects of earlier ones."""
    rounds: list[list[int]] = []
    seen: dict[CustodyKey, int] = {}
    for n, o in enumerate(observations):
        k = seen.get(o.key, 0)
        seen[o.key] = k + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(n)
    return rounds


def _apply_round(conn: Connection, batch: list[tuple[int, Observation]], results: list) -> None:
    rows = {n: _row(n, o) for n, o in batch}
    known = []
    for idx, ticket_id, created in conn.execute(_CREATE, {"rows": json_array(rows.values()),
                                                          "priority": DEFAULT_PRIORITY, "actor": INTAKE_ACTOR}):
        if created:
            results[idx] = IntakeResult("created", ticket_id)
        else:
            known.append((idx, ticket_id))
    if not known:
        return
    known.sort()
    document = json_array(f'{rows[idx][:-1]},"ticket_id":{ticket_id}}}' for idx, ticket_id in known)
    observed = {idx: updated for idx, updated in conn.execute(_OBSERVE, {"rows": document})}
    for idx, ticket_id in known:
        outcome = "unchanged" if idx not in observed else ("updated" if observed[idx] else "stale")
        results[idx] = IntakeResult(outcome, ticket_id)


def _row(n: int, o: Observation) -> str:
    """One version's row of the round's document, the issue's canonical JSON spliced in as it is."""
    head = json.dumps({"idx": n, "tenant": o.key.tenant, "key": o.key.registration_key, "ref": o.key.external_ref,
                       "project": o.project, "labels": o.labels, "digest": o.digest, "work_id": o.work_id,
                       "work_token": o.work_token})
    return f'{head[:-1]},"issue":{o.issue_json}}}'


# One JSON document per round (as the poll admits receipts): each version's custody key, labels,
# digest and work item, and its issue, whose fields the statements read from it.
_INPUT = """
SELECT d.idx, d.tenant, d.key, d.ref, d.project, d.issue->>'title' AS title, d.issue->>'description' AS description,
       d.labels, d.issue->>'external_state' AS state, (d.issue->>'external_updated_at')::timestamptz AS updated_at,
       d.digest, d.issue->>'connector_kind' AS kind, d.issue->>'display_url' AS url, d.work_id, d.work_token,
       d.issue, d.ticket_id
  FROM jsonb_to_recordset(%(rows)s::jsonb)
    AS d(idx int, tenant text, key text, ref text, project text, labels text[], digest text, work_id bigint,
         work_token bigint, issue jsonb, ticket_id bigint)
"""

# The first observation of each issue not linked yet: the ticket, its custody link, the P2
# and UNTRIAGED facts, the triage finding and the observation, for the whole round in one
# statement that also answers the ticket of each issue already linked (for `_OBSERVE`).
# Ticket ids are drawn up front so every new row knows its own. Each version's custody link is
# one probe of the links' key (a subquery per row): as a join, the planner, which takes the
# JSON document for 100 rows, hashes every link of every registration per round.
_CREATE = f"""
WITH given AS MATERIALIZED (
    SELECT i.*, (SELECT l.ticket_id FROM ticket_custody_links l
                  WHERE l.tenant = i.tenant AND l.registration_key = i.key AND l.external_ref = i.ref) AS linked_id
      FROM ({_INPUT}) i
), input AS MATERIALIZED (
    -- the sequence's name is looked up once per statement (a subquery), not once per row
    SELECT i.*, nextval((SELECT pg_get_serial_sequence('tickets', 'ticket_id'))) AS new_id
      FROM (SELECT * FROM given WHERE linked_id IS NULL ORDER BY idx) i
), ticket AS (
    INSERT INTO tickets (ticket_id, tenant, project, title, description, labels, priority, triage_state,
                         source_state, source_updated_at, source_digest)
    OVERRIDING SYSTEM VALUE
    SELECT new_id, tenant, project, title, description, labels, %(priority)s, 'UNTRIAGED', state, updated_at, digest
      FROM input ORDER BY idx
), link AS (
    INSERT INTO ticket_custody_links (tenant, registration_key, external_ref, ticket_id, connector_kind, display_url,
                                      linked_by_work_id)
    SELECT tenant, key, ref, new_id, kind, url, work_id FROM input ORDER BY idx
), priority AS (
    INSERT INTO ticket_priority_facts (ticket_id, priority, prior_priority, actor, reason, recorded_at)
    SELECT new_id, %(priority)s, NULL, %(actor)s, 'automatic default at intake; not an actor decision',
           statement_timestamp() FROM input ORDER BY idx
), triage AS (
    -- one timestamp for both intake facts: the CTEs run in no defined order
    INSERT INTO ticket_triage_facts (ticket_id, triage_state, actor, reason, recorded_at)
    SELECT new_id, 'UNTRIAGED', %(actor)s, 'created by connector intake', statement_timestamp()
      FROM input ORDER BY idx
), finding AS (
    INSERT INTO attention_findings (kind, owner_role, tenant, project, ticket_id, opened_by)
    SELECT 'connector_triage_required', 'commander', tenant, project, new_id, %(actor)s FROM input ORDER BY idx
), observation AS (
    INSERT INTO ticket_observations (ticket_id, external_ref, source_digest, source_updated_at, issue, work_id,
                                     work_token)
    SELECT new_id, ref, digest, updated_at, issue, work_id, work_token FROM input ORDER BY idx
)
SELECT idx, new_id, true FROM input
UNION ALL
SELECT idx, linked_id, false FROM given WHERE linked_id IS NOT NULL
"""

# A known issue: append the observation unless this digest was observed before (unchanged:
# nothing written), and update the ticket unless an observed version is newer (stale: only
# the observation is kept). The update's snapshot holds the older observations only, which
# is the comparison that matters: the new one carries this version's own time.
_OBSERVE = f"""
WITH input AS MATERIALIZED ({_INPUT}), inserted AS (
    INSERT INTO ticket_observations (ticket_id, external_ref, source_digest, source_updated_at, issue, work_id,
                                     work_token)
    SELECT ticket_id, ref, digest, updated_at, issue, work_id, work_token FROM input ORDER BY idx
    ON CONFLICT (ticket_id, source_digest) DO NOTHING
    RETURNING ticket_id
), updated AS (
    UPDATE tickets t
       SET title = i.title, description = i.description, labels = i.labels, source_state = i.state,
           source_updated_at = i.updated_at, source_digest = i.digest, version = t.version + 1,
           updated_at = clock_timestamp()
      FROM input i JOIN inserted USING (ticket_id)
     WHERE t.ticket_id = i.ticket_id
       AND i.updated_at >= coalesce((SELECT max(o.source_updated_at) FROM ticket_observations o
                                      WHERE o.ticket_id = i.ticket_id), '-infinity')
    RETURNING t.ticket_id
)
SELECT i.idx, updated.ticket_id IS NOT NULL
  FROM input i JOIN inserted USING (ticket_id) LEFT JOIN updated USING (ticket_id)
"""


SWEEP_GAP_FINDING = "connector_sweep_gap"


def open_sweep_gap_finding(conn: Connection, ticket_id: int, *, tenant: str, project: str, work_id: int) -> None:
    """The ticket's version was found by a reconciliation sweep, not by the incremental scans:
    whatever the ticket's state, its commander sees it on the Attention page until triage
    (of an untriaged ticket) or an acknowledgement resolves it. One finding per re-observed
    version, named by the work item that applied it, so a redelivered item opens none twice."""
    conn.execute(
        """INSERT INTO attention_findings (kind, owner_role, tenant, project, ticket_id, opened_by, work_id)
           VALUES (%s, 'commander', %s, %s, %s, 'system:sweep', %s)
           ON CONFLICT (work_id) WHERE kind = 'connector_sweep_gap' DO NOTHING""",
        (SWEEP_GAP_FINDING, tenant, project, ticket_id, work_id),
    )
