-- Durable connector work queue (seed 000): ingress receipts, immutable outbox
-- events, executable work items and generation receipts.
--
-- Ownership: a receipt owns admission and pre-materialization routing state; an
-- event is an immutable fact (no executor state at all); a work item owns every
-- piece of executable state (state, attempts, lease, fencing token, lanes).
-- "registration" is the connector registration (the seed's installed pack) and
-- "revision" its generation.

-- One sequence hands out every claim token of receipts and work items, without a
-- cache, so tokens strictly increase across sessions.
CREATE SEQUENCE workqueue_tokens AS bigint;

CREATE TABLE ingress_receipts (
    receipt_id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    registration_id     text NOT NULL,
    revision            integer NOT NULL,
    namespace           text NOT NULL,            -- connector namespace of the delivery
    delivery_id         text NOT NULL,            -- provider delivery identity
    http_method         text NOT NULL DEFAULT 'POST',
    route_key           text NOT NULL,
    content_type        text,
    event_kind          text,
    received_at         timestamptz NOT NULL,
    accepted_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    admission_result    text NOT NULL DEFAULT 'verified',
    correlation         jsonb NOT NULL DEFAULT '{}'::jsonb,   -- safe correlation ids only
    body                jsonb,                                -- bounded body snapshot
    body_ref            text,                                 -- or a reference to it
    payload_hash        text NOT NULL,
    -- receipt-router state (until materialized or terminally failed)
    routing_status      text NOT NULL DEFAULT 'pending'
                        CHECK (routing_status IN ('pending', 'routing', 'materialized', 'failed')),
    routing_attempts    integer NOT NULL DEFAULT 0,
    max_routing_attempts integer NOT NULL DEFAULT 5 CHECK (max_routing_attempts > 0),
    next_attempt_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    router_owner        text,
    router_token        bigint,
    router_lease_until  timestamptz,
    enqueued_event_ids  bigint[],
    routing_error_class text,
    routing_error       text,
    materialized_at     timestamptz,
    updated_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (registration_id, namespace, delivery_id),
    CHECK (body IS NOT NULL OR body_ref IS NOT NULL),
    CHECK (routing_status <> 'routing'
           OR (router_owner IS NOT NULL AND router_token IS NOT NULL AND router_lease_until IS NOT NULL))
);
-- Due receipts: pending ones by next attempt time, routing ones by lease expiry
-- (a claim sets next_attempt_at to the lease deadline, so one index finds both).
CREATE INDEX ingress_receipts_due ON ingress_receipts (next_attempt_at, receipt_id)
    WHERE routing_status IN ('pending', 'routing');

CREATE TABLE connector_outbox_events (
    event_id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- also the enqueue order
    receipt_id          bigint NOT NULL REFERENCES ingress_receipts (receipt_id),
    registration_id     text NOT NULL,
    revision            integer NOT NULL,
    route_id            text NOT NULL,
    route_version       integer NOT NULL,
    source_kind         text NOT NULL,
    source_id           text NOT NULL,
    idempotency_key     text NOT NULL,
    delivery_seq        integer NOT NULL,          -- ordinal of the event within its receipt
    payload_hash        text NOT NULL,
    payload             jsonb,
    parse_outcome       text NOT NULL DEFAULT 'parsed',
    companion           jsonb,
    correlation         jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (registration_id, idempotency_key)
);
CREATE INDEX connector_outbox_events_receipt ON connector_outbox_events (receipt_id);

-- Events are immutable facts.
CREATE FUNCTION workqueue_immutable_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% rows are immutable', TG_TABLE_NAME
        USING ERRCODE = 'integrity_constraint_violation';
END $$;
CREATE TRIGGER connector_outbox_events_no_update BEFORE UPDATE ON connector_outbox_events
    FOR EACH ROW EXECUTE FUNCTION workqueue_immutable_row();

CREATE TABLE connector_work_items (
    work_id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id            bigint NOT NULL REFERENCES connector_outbox_events (event_id),
    registration_id     text NOT NULL,
    revision            integer NOT NULL,
    work_type           text NOT NULL,
    queue_class         text NOT NULL DEFAULT 'default',
    state               text NOT NULL DEFAULT 'pending'
                        CHECK (state IN ('pending', 'running', 'retry', 'completed', 'dead',
                                         -- reserved for rollback fencing (seed gates 4 and 5)
                                         'awaiting_legacy_outcome', 'reconciled_legacy_terminal')),
    run_after           timestamptz NOT NULL DEFAULT clock_timestamp(),
    priority            smallint NOT NULL DEFAULT 0,
    attempts            integer NOT NULL DEFAULT 0,
    max_attempts        integer NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
    reclaims            integer NOT NULL DEFAULT 0,
    replays             integer NOT NULL DEFAULT 0,
    outcome             text,
    failure_class       text,
    failure_summary     text CHECK (length(failure_summary) <= 1000),
    lease_owner         text,
    lease_token         bigint,
    lease_until         timestamptz,
    source_lane_key     text,
    target_lane_key     text,
    -- reserved for rollback fencing (seed gates 4 and 5)
    rollback_fence_id   bigint,
    legacy_outcome_receipt_version integer,
    legacy_outcome_digest text,
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    claimed_at          timestamptz,
    finished_at         timestamptz,
    updated_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (event_id, work_type),
    CHECK (state <> 'running' OR (lease_owner IS NOT NULL AND lease_token IS NOT NULL AND lease_until IS NOT NULL))
);

-- Claim candidates: the seed's (pack, queue class, state, run_after, work_id),
-- scoped by generation (claims are generation-gated) and with the claimable states
-- as the partial predicate, so finished rows leave the index.
CREATE INDEX connector_work_items_due
    ON connector_work_items (registration_id, revision, queue_class, run_after, work_id)
    WHERE state IN ('pending', 'retry');
-- Source lane head check: the lowest unfinished work_id of a lane is its head.
CREATE INDEX connector_work_items_source_lane
    ON connector_work_items (registration_id, source_lane_key, work_id)
    WHERE state IN ('pending', 'retry', 'running') AND source_lane_key IS NOT NULL;
-- At most one in-flight item per source lane and per target mutation lane,
-- enforced by the database; items without a lane do not participate.
CREATE UNIQUE INDEX connector_work_items_source_inflight
    ON connector_work_items (registration_id, source_lane_key)
    WHERE state = 'running' AND source_lane_key IS NOT NULL;
CREATE UNIQUE INDEX connector_work_items_target_inflight
    ON connector_work_items (registration_id, target_lane_key)
    WHERE state = 'running' AND target_lane_key IS NOT NULL;
-- Leases: reclaim scans and lease counts.
CREATE INDEX connector_work_items_leases
    ON connector_work_items (lease_until)
    WHERE state = 'running';
-- The DLQ read path.
CREATE INDEX connector_work_items_dead
    ON connector_work_items (registration_id, work_id)
    WHERE state = 'dead';

-- The current claim ownership of each generation. Only 'active' generations are
-- claimable; 'quiescing' stops new claims while leases drain; 'quiesced' carries a
-- drain proof. 'rolling_back' and 'legacy' are reserved for rollback fencing.
CREATE TABLE workqueue_generations (
    registration_id     text NOT NULL,
    revision            integer NOT NULL,
    status              text NOT NULL
                        CHECK (status IN ('active', 'quiescing', 'quiesced', 'rolling_back', 'legacy')),
    activation_receipt_id bigint,
    route_versions      jsonb NOT NULL DEFAULT '{}'::jsonb,
    updated_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (registration_id, revision)
);
-- At most one claimable generation per registration.
CREATE UNIQUE INDEX workqueue_generations_one_active
    ON workqueue_generations (registration_id) WHERE status = 'active';

-- Durable, immutable generation receipts: activation (binding its proof and route
-- versions), quiesce, drained (binding the zero-lease proof).
CREATE TABLE workqueue_generation_receipts (
    receipt_id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    registration_id     text NOT NULL,
    revision            integer NOT NULL,
    kind                text NOT NULL CHECK (kind IN ('activation', 'quiesce', 'drained')),
    recorded_by         text NOT NULL,
    proof               jsonb NOT NULL,
    recorded_at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX workqueue_generation_receipts_gen
    ON workqueue_generation_receipts (registration_id, revision, receipt_id);
CREATE TRIGGER workqueue_generation_receipts_no_update BEFORE UPDATE ON workqueue_generation_receipts
    FOR EACH ROW EXECUTE FUNCTION workqueue_immutable_row();

-- Operator replays of dead work items (audit; the work item row is the new attempt).
CREATE TABLE workqueue_replays (
    replay_id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    work_id             bigint NOT NULL REFERENCES connector_work_items (work_id),
    requested_by        text NOT NULL,
    prior_failure_class text,
    prior_failure_summary text,
    requested_at        timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX workqueue_replays_work ON workqueue_replays (work_id);
