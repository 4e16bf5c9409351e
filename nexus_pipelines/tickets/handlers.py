"""The two ticket work types of the work queue and the receipt route that feeds one of them.

* `ticket.observe` (from the poll's receipts): applies a batch of issue versions to
  custody, observations and tickets in one transaction with set-based statements, each
  item fenced by its own token (an item whose lease is lost writes nothing and is
  reported lost; the others commit), and completes the WorkItem-path items in that same
  transaction.
* `issue.close` (from an accepted proof): counts a dispatch durably before any
  provider call, runs the connector's comment-and-close through the core retry
  executor, and stores the one receipt. A later dispatch of the same command always
  asks the adapter to look for the marker before it writes (`reconcile_first`), so a
  crash, a lost lease or a replay never posts a second comment. A retryable failure is
  retried by the queue no sooner than the provider asked (a throttled one, held by the
  provider's gate or refused by the provider, spends no attempt), and so is an ambiguous
  write (a reconciliation read that kept failing): its retry reads for the marker before it
  may write. A terminal failure dead-letters the item at once, an ambiguous one only when
  its attempts are spent (an operator replays it after looking; the replay reconciles first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from psycopg_pool import ConnectionPool
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nexus_pipelines.connectors.core import store as connector_store
from nexus_pipelines.connectors.core.executor import RetryExecutor
from nexus_pipelines.connectors.core.registry import ConnectorRegistry
from nexus_pipelines.connectors.core.tick import Composer
from nexus_pipelines.connectors.core.values import (
    AmbiguousWrite,
    CloseExternalIssue,
    ConnectorReceipt,
    ExternalIssue,
    digest_of,
    first_error,
)
from nexus_pipelines.connectors.core.sweep import SWEPT_MARK
from nexus_pipelines.tickets.intake import (
    CustodyKey,
    Observation,
    apply_observations,
    open_sweep_gap_finding,
    plan_without_table_scans,
)
from nexus_pipelines.tickets.proofs import CLOSE_ROUTE, CLOSE_WORK_TYPE, ticket_lane
from nexus_pipelines.workqueue.claims import ClaimedItem, lock_fence, lock_fences
from nexus_pipelines.workqueue.handlers import (
    Batched,
    BatchResult,
    Deferred,
    Handler,
    PermanentError,
    RetryLater,
    complete_with_effects,
)
from nexus_pipelines.workqueue.receipts import RECEIPT_BODY, ClaimedReceipt, EventSpec, Route, RoutingRejected, WorkSpec

OBSERVE_WORK_TYPE = "ticket.observe"
OBSERVE_ROUTE = (connector_store.OBSERVE_ROUTE_KEY, 1)
LOST = "lease_lost"  # the worker discards results of lost items; this only names why


def route_versions() -> dict[str, int]:
    """What a connector generation's activation receipt binds (replay checks it)."""
    return {OBSERVE_ROUTE[0]: OBSERVE_ROUTE[1], CLOSE_ROUTE[0]: CLOSE_ROUTE[1]}


def _materialize_observation(receipt: ClaimedReceipt) -> list[EventSpec]:
    """The receipt's body as the event's payload, unparsed: its issue's lanes come from the
    receipt's correlation, which the poll writes from the same version (the drain checks that
    the lane is the issue it carries)."""
    ref = receipt.correlation.get("external_ref")
    if not isinstance(ref, str) or not ref:
        raise RoutingRejected("an observation receipt names no external_ref in its correlation")
    return [
        EventSpec(
            source_kind="external_issue",
            source_id=ref,
            idempotency_key=f"observe:{receipt.delivery_id}",
            payload=RECEIPT_BODY,
            work=[WorkSpec(OBSERVE_WORK_TYPE, source_lane_key=ref, target_lane_key=ticket_lane(ref))],
        )
    ]


OBSERVATION_ROUTE = Route(OBSERVE_ROUTE[0], OBSERVE_ROUTE[1], _materialize_observation)


class _ObservedVersion(BaseModel):
    """A `ticket.observe` payload: the receipt body a poll (or a sweep, marked) wrote for one
    issue version, validated from its JSON text in one pass."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    digest: str
    issue: ExternalIssue
    labels: tuple[str, ...]
    project: str
    swept: bool = Field(default=False, alias=SWEPT_MARK)


def _observation(item: ClaimedItem) -> tuple[Observation, bool]:
    """The issue version a `ticket.observe` item carries, and whether a reconciliation sweep found
    it; PermanentError when it carries none, or one that does not match its digest or its lane."""
    if item.payload_json is None:
        raise PermanentError(f"work item {item.work_id} carries no valid issue (no payload)")
    try:
        version = _ObservedVersion.model_validate_json(item.payload_json)
    except ValidationError as exc:
        raise PermanentError(f"work item {item.work_id} carries no valid issue ({first_error(exc)})") from None
    issue = version.issue
    tenant, _, key = item.registration_id.partition("/")
    observation = Observation(CustodyKey(tenant, key, issue.external_ref), project=version.project, issue=issue,
                              digest=version.digest, labels=list(version.labels), work_id=item.work_id,
                              work_token=item.token)
    if digest_of(observation.issue_json) != version.digest:
        raise PermanentError(f"work item {item.work_id}: the issue does not match its source digest")
    if item.source_lane_key != issue.external_ref:
        raise PermanentError(f"work item {item.work_id}: its source lane is not the issue it carries")
    return observation, version.swept


@dataclass(frozen=True)
class TicketHandlers:
    pool: ConnectionPool
    registry: ConnectorRegistry
    compose: Composer
    executor_factory: Callable[[], RetryExecutor] = RetryExecutor

    def as_dict(self) -> dict[str, Handler]:
        return {OBSERVE_WORK_TYPE: Batched(self.observe_batch), CLOSE_WORK_TYPE: self.close}

    # -- ticket.observe ---------------------------------------------------------------

    def observe(self, item: ClaimedItem) -> str | None:
        return Batched(self.observe_batch)(item)

    def observe_batch(self, items: Sequence[ClaimedItem]) -> list[BatchResult]:
        results: list[BatchResult] = [LOST] * len(items)
        valid: list[tuple[int, ClaimedItem, Observation]] = []
        swept: set[int] = set()  # the work ids of versions a reconciliation sweep found
        for n, item in enumerate(items):
            try:
                observation, found_by_sweep = _observation(item)
            except PermanentError as exc:
                results[n] = exc
                continue
            valid.append((n, item, observation))
            if found_by_sweep:
                swept.add(item.work_id)
        if not valid:
            return results
        with self.pool.connection() as conn, conn.transaction():
            held = lock_fences(conn, [item for _, item, _ in valid])
            live = [(n, item, observation) for n, item, observation in valid if item.fence in held]
            plan_without_table_scans(conn)
            applied = apply_observations(conn, [observation for _, _, observation in live])
            for (_, item, observation), result in zip(live, applied):
                if item.work_id in swept:  # found by a reconciliation sweep, not by the scans
                    open_sweep_gap_finding(conn, result.ticket_id, tenant=observation.key.tenant,
                                           project=observation.project, work_id=observation.work_id)
            answers = complete_with_effects(conn, [item for _, item, _ in live], [r.outcome for r in applied])
        for (n, _, _), answer in zip(live, answers):
            results[n] = answer
        return results

    # -- issue.close ------------------------------------------------------------------

    def close(self, item: ClaimedItem) -> str:
        command_id = item.payload["command_id"]
        with self.pool.connection() as conn:
            command = conn.execute(
                """SELECT c.external_ref, c.marker, c.comment, c.dispatches, c.ticket_id,
                          (SELECT comment_ref FROM ticket_close_receipts r WHERE r.command_id = c.command_id)
                     FROM ticket_close_commands c WHERE c.command_id = %s""",
                (command_id,),
            ).fetchone()
            if command is None:
                raise PermanentError(f"close command {command_id} does not exist")
            external_ref, marker, comment, dispatches, ticket_id, delivered = command
            if delivered is not None:
                return "already_delivered"
            with conn.transaction():
                if not lock_fence(conn, item):
                    return LOST
                conn.execute(
                    """UPDATE ticket_close_commands SET dispatches = dispatches + 1, status = 'dispatched',
                              updated_at = clock_timestamp() WHERE command_id = %s""",
                    (command_id,),
                )
            stored = connector_store.revision_by_number(conn, self.registry, item.registration_id, item.revision)
        if stored is None:
            raise PermanentError(f"{item.registration_id} revision {item.revision} is not registered")
        request = CloseExternalIssue(external_ref=external_ref, command_id=command_id, marker=marker,
                                     comment=comment, reconcile_first=dispatches > 0)
        result, _ = self.executor_factory().close(self.compose(stored.registration), request)
        return self._settle(item, ticket_id, result)

    def _settle(self, item: ClaimedItem, ticket_id: int, result) -> str:
        command_id = item.payload["command_id"]
        with self.pool.connection() as conn, conn.transaction():
            if isinstance(result, ConnectorReceipt):
                # A receipt is a provider fact, recorded even by a holder that lost its lease:
                # the key allows one, and whoever records second finds it already there.
                conn.execute(
                    """INSERT INTO ticket_close_receipts (command_id, ticket_id, external_ref, marker, comment_ref,
                                                          work_id)
                       VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (command_id) DO NOTHING""",
                    (command_id, ticket_id, result.external_ref, result.marker, result.comment_ref, item.work_id),
                )
                self._status(conn, command_id, "delivered", "receipt", "")
                return "delivered"
            status = "ambiguous" if isinstance(result, AmbiguousWrite) else (
                "failed" if result.retry_class == "terminal" else "dispatched")
            label = result.kind if isinstance(result, AmbiguousWrite) else f"{result.retry_class}:{result.reason}"
            self._status(conn, command_id, status, label, result.detail)
        detail = f"close {command_id}: {label}" + (f" ({result.detail})" if result.detail else "")
        if isinstance(result, AmbiguousWrite):
            # the next dispatch reconciles first (dispatches > 0), so retrying cannot write blindly
            raise RetryLater(detail + "; if its attempts are spent, inspect the issue, then replay the work item: "
                             "the replay looks for the marker before it writes", 0.0)
        if result.reason == "throttled":
            # the provider's wait (or its gate's), not the item's failure: it spends no attempt
            raise Deferred(detail, result.retry_after_seconds or 0.0)
        if result.retry_class == "retryable":
            raise RetryLater(detail, result.retry_after_seconds or 0.0)
        raise PermanentError(detail)

    @staticmethod
    def _status(conn, command_id: str, status: str, label: str, detail: str) -> None:
        conn.execute(
            """UPDATE ticket_close_commands SET status = %s, last_result = %s, last_detail = %s,
                      updated_at = clock_timestamp() WHERE command_id = %s""",
            (status, label, detail[:300], command_id),
        )
