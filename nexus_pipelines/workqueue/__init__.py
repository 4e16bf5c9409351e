"""Durable connector work queue (docs/design/work-queue.md).

Three row families with separate ownership:

* `ingress_receipts` (IngressReceipt): provider admission and pre-materialization
  routing state (router claim, token, lease, attempts, terminal routing failure).
* `connector_outbox_events` (ConnectorOutboxEvent): immutable materialized facts;
  no executor state at all (an UPDATE trigger rejects changes).
* `connector_work_items` (ConnectorWorkItem): all executable state: state, run_after,
  attempts, lease owner/token/deadline, lanes, outcome, sanitized failure summary.

Work items are claimed in batches by primary-key compare-and-swap with fencing tokens
(`claims.py`), drained by `worker.drain`, gated per (registration, revision) by
durable generation receipts (`generations.py`); dead items are listed and replayed
through `dlq.py`.

A generation is owned by one claim path at a time, enforced by the database: the
WorkItem path above, or the Event path (`event_path.py`: one scheduler-lease holder
running the generation's work in delivery order, with its state in
`event_executions`). `rollback.py` fences a WorkItem generation's pending work and
hands it to the Event path (the rollback fence); the Event path's terminal outcomes come with
versioned receipts (`legacy_outcomes.py`) from which fenced items are reconciled, and
`generations.activate` cuts an Event-owned generation back over (the re-cutover). Both
executors share `execution.py` and reconnect through `session.py`; `claimants.py`
registers running drains; every state list is in `states.py`.

Modules here import no Dagster; `jobs.py`, `sensors.py`, `assets.py` and
`definitions.py` are the Dagster layer.

Lane policy (see `claims.py`): an item waiting to retry keeps holding its *source*
lane (later items of the lane wait behind it, so source FIFO holds across retries)
but does not hold its *target* mutation lane (that lane only serializes in-flight
mutations). Dead-lettering releases both lanes.
"""
