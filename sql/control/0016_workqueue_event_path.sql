-- One active claim path per generation (seed 000, gates 4 and 5): a generation is
-- owned by the WorkItem path (row CAS on connector_work_items) or by the Event path
-- (one generation-wide scheduler lease in `leases`, executing events in delivery
-- order with its state in event_executions), never both. The state lists here are
-- the ones in nexus_pipelines/workqueue/states.py (a test compares them).

-- Generations: the owner is one column (0015), so a generation cannot be owned twice.
-- The reserved status 'legacy' was never written; a row with it is Event-owned and stopped.
UPDATE workqueue_generations SET claim_path = 'event', status = 'quiesced' WHERE status = 'legacy';
ALTER TABLE workqueue_generations DROP CONSTRAINT workqueue_generations_status_check;
ALTER TABLE workqueue_generations ADD CONSTRAINT workqueue_generations_status_check
    CHECK (status IN ('active', 'quiescing', 'quiesced', 'rolling_back'));
ALTER TABLE workqueue_generations ADD CONSTRAINT workqueue_generations_claim_path_check
    CHECK (claim_path IN ('work_item', 'event'));
ALTER TABLE workqueue_generations ADD CONSTRAINT workqueue_generations_rollback_is_work_item_check
    CHECK (status <> 'rolling_back' OR (claim_path = 'work_item' AND claims_disabled_at IS NOT NULL));

ALTER TABLE workqueue_generation_receipts DROP CONSTRAINT workqueue_generation_receipts_kind_check;
ALTER TABLE workqueue_generation_receipts ADD CONSTRAINT workqueue_generation_receipts_kind_check
    CHECK (kind IN ('activation', 'quiesce', 'drained', 'claims_disabled', 'rollback_fence', 'event_activation'));

-- Work items: the rollback fence.
-- The fence id is the rollback_fence generation receipt that fenced the item.
ALTER TABLE connector_work_items ADD CONSTRAINT connector_work_items_fence_fkey
    FOREIGN KEY (rollback_fence_id) REFERENCES workqueue_generation_receipts (receipt_id);
ALTER TABLE connector_work_items ADD CONSTRAINT connector_work_items_fenced_check
    CHECK (state NOT IN ('awaiting_legacy_outcome', 'reconciled_legacy_terminal') OR rollback_fence_id IS NOT NULL);
ALTER TABLE connector_work_items ADD CONSTRAINT connector_work_items_reconciled_check
    CHECK (state <> 'reconciled_legacy_terminal'
           OR (legacy_outcome_receipt_version IS NOT NULL AND legacy_outcome_digest IS NOT NULL));
CREATE INDEX connector_work_items_fenced
    ON connector_work_items (registration_id, revision, rollback_fence_id, work_id)
    WHERE rollback_fence_id IS NOT NULL;

-- The Event path's execution state, one row per logical work (event, work type); the
-- immutable event row is never touched. `work_id` is the logical work's id on both
-- paths: a fenced work item keeps its id here, and a new event's work takes its id
-- from the work items' sequence, so a cutover that hands it back creates the work item
-- with the same id (handlers keying effects by work_id see one id per logical work).
CREATE TABLE event_executions (
    work_id             bigint PRIMARY KEY DEFAULT nextval('connector_work_items_work_id_seq'),
    event_id            bigint NOT NULL REFERENCES connector_outbox_events (event_id),
    work_type           text NOT NULL,
    registration_id     text NOT NULL,
    revision            integer NOT NULL,
    queue_class         text NOT NULL DEFAULT 'default',
    source_lane_key     text,
    target_lane_key     text,
    state               text NOT NULL DEFAULT 'pending'
                        CHECK (state IN ('pending', 'started', 'retry', 'succeeded', 'failed', 'unknown', 'transferred')),
    attempts            integer NOT NULL DEFAULT 0,
    max_attempts        integer NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
    run_after           timestamptz NOT NULL DEFAULT clock_timestamp(),
    start_token         bigint,            -- the scheduler lease token of the attempt started last
    started_at          timestamptz,
    finished_at         timestamptz,
    outcome             text,
    failure_class       text,
    failure_summary     text CHECK (length(failure_summary) <= 1000),
    rollback_fence_id   bigint REFERENCES workqueue_generation_receipts (receipt_id),
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (event_id, work_type),
    CHECK (state <> 'started' OR (start_token IS NOT NULL AND started_at IS NOT NULL))
);
-- Delivery order: the executor takes the lowest unfinished event id first.
CREATE INDEX event_executions_unfinished
    ON event_executions (registration_id, revision, event_id, work_type)
    WHERE state IN ('pending', 'started', 'retry');
CREATE INDEX event_executions_source_lane
    ON event_executions (registration_id, revision, source_lane_key, event_id)
    WHERE state IN ('pending', 'started', 'retry') AND source_lane_key IS NOT NULL;
-- The Event path's failure / DLQ read path.
CREATE INDEX event_executions_failed
    ON event_executions (registration_id, revision, work_id)
    WHERE state IN ('failed', 'unknown');

-- Versioned LegacyOutcomeReceipts: written by the Event path in the transaction that
-- records an execution's terminal outcome (version 1), or by an operator confirming an
-- unknown outcome (the next version). Immutable. The projector reconciles a fenced work
-- item from the latest receipt of its work_id.
CREATE TABLE legacy_outcome_receipts (
    receipt_id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    work_id             bigint NOT NULL REFERENCES event_executions (work_id),
    event_id            bigint NOT NULL REFERENCES connector_outbox_events (event_id),
    work_type           text NOT NULL,
    registration_id     text NOT NULL,
    revision            integer NOT NULL,
    version             integer NOT NULL CHECK (version > 0),
    outcome             text NOT NULL CHECK (outcome IN ('succeeded', 'failed', 'unknown')),
    rollback_fence_id   bigint REFERENCES workqueue_generation_receipts (receipt_id),
    execution_token     bigint,            -- scheduler lease token of the attempt; NULL when confirmed by an operator
    detail              jsonb NOT NULL DEFAULT '{}'::jsonb,
    digest              text NOT NULL,
    recorded_by         text NOT NULL,
    recorded_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (work_id, version)
);
CREATE INDEX legacy_outcome_receipts_fence ON legacy_outcome_receipts (rollback_fence_id, work_id)
    WHERE rollback_fence_id IS NOT NULL;
CREATE TRIGGER legacy_outcome_receipts_no_update BEFORE UPDATE ON legacy_outcome_receipts
    FOR EACH ROW EXECUTE FUNCTION workqueue_immutable_row();
CREATE TRIGGER legacy_outcome_receipts_no_delete BEFORE DELETE ON legacy_outcome_receipts
    FOR EACH ROW EXECUTE FUNCTION workqueue_immutable_row();
CREATE TRIGGER legacy_outcome_receipts_no_truncate BEFORE TRUNCATE ON legacy_outcome_receipts
    FOR EACH STATEMENT EXECUTE FUNCTION workqueue_immutable_row();
