-- Internal tickets created from connector intake, their custody, observations and
-- facts, accepted success proofs, close commands and close receipts (seed 002).
-- Every fact table is append-only: an UPDATE or DELETE trigger refuses changes.

CREATE TABLE tickets (
    ticket_id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant              text NOT NULL,
    project             text NOT NULL,
    title               text NOT NULL,
    description         text NOT NULL,
    labels              text[] NOT NULL DEFAULT '{}',
    status              text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'done', 'cancelled')),
    triage_state        text NOT NULL DEFAULT 'UNTRIAGED'
                        CHECK (triage_state IN ('UNTRIAGED', 'ACCEPTED', 'DUPLICATE', 'REJECTED')),
    priority            text NOT NULL DEFAULT 'P2' CHECK (priority IN ('P0', 'P1', 'P2', 'P3', 'P4')),
    source_state        text NOT NULL CHECK (source_state IN ('open', 'closed')),
    source_updated_at   timestamptz NOT NULL,
    source_digest       text NOT NULL,
    version             integer NOT NULL DEFAULT 1 CHECK (version > 0),
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX tickets_project ON tickets (tenant, project, status, triage_state);

CREATE FUNCTION tickets_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% rows are append-only facts', TG_TABLE_NAME
        USING ERRCODE = 'integrity_constraint_violation';
END $$;

-- Exact external-reference custody (CX-06): one ticket per key, one key per ticket.
CREATE TABLE ticket_custody_links (
    tenant              text NOT NULL,
    registration_key    text NOT NULL,
    external_ref        text NOT NULL CHECK (external_ref ~ '^[a-z][a-z0-9_]{1,31}:[A-Za-z0-9._-]{1,128}:[A-Za-z0-9._-]{1,128}$'),
    ticket_id           bigint NOT NULL UNIQUE REFERENCES tickets (ticket_id),
    connector_kind      text NOT NULL,
    display_url         text NOT NULL,
    linked_by_work_id   bigint NOT NULL,
    linked_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (tenant, registration_key, external_ref)
);
CREATE TRIGGER ticket_custody_links_immutable BEFORE UPDATE OR DELETE ON ticket_custody_links
    FOR EACH ROW EXECUTE FUNCTION tickets_append_only();

-- Immutable source observations (CX-07): one per distinct source version digest (the
-- digest covers the provider's update time, so a reverted edit is a new version).
CREATE TABLE ticket_observations (
    observation_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ticket_id           bigint NOT NULL REFERENCES tickets (ticket_id),
    external_ref        text NOT NULL,
    source_digest       text NOT NULL CHECK (source_digest ~ '^sha256:[0-9a-f]{64}$'),
    source_updated_at   timestamptz NOT NULL,
    issue               jsonb NOT NULL,           -- the normalized ExternalIssue (external_untrusted)
    work_id             bigint NOT NULL,
    work_token          bigint NOT NULL,
    observed_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (ticket_id, source_digest)
);
CREATE INDEX ticket_observations_latest ON ticket_observations (ticket_id, source_updated_at DESC, observation_id DESC);
CREATE TRIGGER ticket_observations_immutable BEFORE UPDATE OR DELETE ON ticket_observations
    FOR EACH ROW EXECUTE FUNCTION tickets_append_only();

-- Priority and triage facts: intake appends the automatic P2 and UNTRIAGED.
CREATE TABLE ticket_priority_facts (
    fact_id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ticket_id           bigint NOT NULL REFERENCES tickets (ticket_id),
    priority            text NOT NULL CHECK (priority IN ('P0', 'P1', 'P2', 'P3', 'P4')),
    prior_priority      text,
    actor               text NOT NULL,            -- 'system:intake' for the automatic default
    reason              text NOT NULL,
    recorded_at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ticket_priority_facts_ticket ON ticket_priority_facts (ticket_id, fact_id);
CREATE TRIGGER ticket_priority_facts_immutable BEFORE UPDATE OR DELETE ON ticket_priority_facts
    FOR EACH ROW EXECUTE FUNCTION tickets_append_only();

CREATE TABLE ticket_triage_facts (
    fact_id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ticket_id           bigint NOT NULL REFERENCES tickets (ticket_id),
    triage_state        text NOT NULL CHECK (triage_state IN ('UNTRIAGED', 'ACCEPTED', 'DUPLICATE', 'REJECTED')),
    actor               text NOT NULL,
    reason              text NOT NULL,
    recorded_at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ticket_triage_facts_ticket ON ticket_triage_facts (ticket_id, fact_id);
CREATE TRIGGER ticket_triage_facts_immutable BEFORE UPDATE OR DELETE ON ticket_triage_facts
    FOR EACH ROW EXECUTE FUNCTION tickets_append_only();

-- Accepted Project success proofs: the only thing that creates a close command (CX-10).
CREATE TABLE ticket_proofs (
    proof_id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ticket_id           bigint NOT NULL REFERENCES tickets (ticket_id),
    proof_kind          text NOT NULL CHECK (proof_kind = 'project_success'),
    verdict             text NOT NULL CHECK (verdict = 'accepted'),
    evidence            text NOT NULL CHECK (length(evidence) BETWEEN 1 AND 2000),
    recorded_by         text NOT NULL,
    client_request_id   text NOT NULL,
    recorded_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (ticket_id, client_request_id)
);
CREATE TRIGGER ticket_proofs_immutable BEFORE UPDATE OR DELETE ON ticket_proofs
    FOR EACH ROW EXECUTE FUNCTION tickets_append_only();

-- One deterministic close command per proof; its dispatch state is core's.
CREATE TABLE ticket_close_commands (
    command_id          text PRIMARY KEY CHECK (command_id ~ '^close-[0-9a-f]{32}$'),
    ticket_id           bigint NOT NULL REFERENCES tickets (ticket_id),
    proof_id            bigint NOT NULL UNIQUE REFERENCES ticket_proofs (proof_id),
    tenant              text NOT NULL,
    registration_key    text NOT NULL,
    external_ref        text NOT NULL,
    marker              text NOT NULL UNIQUE,
    comment             text NOT NULL,
    status              text NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'dispatched', 'delivered', 'failed', 'ambiguous')),
    dispatches          integer NOT NULL DEFAULT 0 CHECK (dispatches >= 0),
    last_result         text,
    last_detail         text CHECK (length(last_detail) <= 300),
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    FOREIGN KEY (tenant, registration_key, external_ref)
        REFERENCES ticket_custody_links (tenant, registration_key, external_ref)
);
CREATE INDEX ticket_close_commands_ticket ON ticket_close_commands (ticket_id);

-- At most one receipt per command: the provider's proof of the marked close.
CREATE TABLE ticket_close_receipts (
    command_id          text PRIMARY KEY REFERENCES ticket_close_commands (command_id),
    ticket_id           bigint NOT NULL REFERENCES tickets (ticket_id),
    external_ref        text NOT NULL,
    marker              text NOT NULL,
    comment_ref         text NOT NULL,
    work_id             bigint NOT NULL,
    recorded_at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TRIGGER ticket_close_receipts_immutable BEFORE UPDATE OR DELETE ON ticket_close_receipts
    FOR EACH ROW EXECUTE FUNCTION tickets_append_only();
