-- Issue connectors (seed 002): registration revisions and per-revision poll progress.
-- Provider-neutral: no provider column, no cursor interpretation. A revision is one
-- work-queue generation: registration_id = tenant || '/' || registration_key and
-- revision = revision_no in the work-queue tables.

CREATE TABLE connector_registrations (
    tenant              text NOT NULL,
    registration_key    text NOT NULL,
    revision_id         text NOT NULL,            -- key@digest-prefix, names the revision
    revision_no         integer NOT NULL CHECK (revision_no > 0),
    digest              text NOT NULL CHECK (digest ~ '^sha256:[0-9a-f]{64}$'),
    connector_kind      text NOT NULL CHECK (connector_kind ~ '^[a-z][a-z0-9_]{1,31}$'),
    schema_id           text NOT NULL,
    project             text NOT NULL,
    config              jsonb NOT NULL,           -- canonical, references only: never a secret
    status              text NOT NULL DEFAULT 'registered'
                        CHECK (status IN ('registered', 'active', 'retiring', 'retired')),
    registered_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    activated_at        timestamptz,
    retired_at          timestamptz,
    PRIMARY KEY (tenant, registration_key, revision_id),
    UNIQUE (tenant, registration_key, revision_no),
    UNIQUE (tenant, registration_key, digest)
);
-- One polling revision per registration key.
CREATE UNIQUE INDEX connector_registrations_one_active
    ON connector_registrations (tenant, registration_key) WHERE status = 'active';

-- The revision's identity, config and digest never change once registered.
CREATE FUNCTION connector_registration_pinned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.tenant, NEW.registration_key, NEW.revision_id, NEW.revision_no, NEW.digest, NEW.connector_kind,
        NEW.schema_id, NEW.project, NEW.config)
       IS DISTINCT FROM
       (OLD.tenant, OLD.registration_key, OLD.revision_id, OLD.revision_no, OLD.digest, OLD.connector_kind,
        OLD.schema_id, OLD.project, OLD.config) THEN
        RAISE EXCEPTION 'a registration revision is immutable; register a new revision instead'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER connector_registrations_pinned BEFORE UPDATE ON connector_registrations
    FOR EACH ROW EXECUTE FUNCTION connector_registration_pinned();

-- Progress of one revision: its opaque cursor, schedule, fenced poll lease and failures.
CREATE TABLE connector_progress (
    tenant              text NOT NULL,
    registration_key    text NOT NULL,
    revision_id         text NOT NULL,
    cursor_token        text CHECK (length(cursor_token) BETWEEN 1 AND 1024),
    exhausted           boolean NOT NULL DEFAULT false,   -- the last page ended a scan
    next_poll_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    lease_owner         text,
    lease_token         bigint,
    lease_until         timestamptz,
    failure_count       integer NOT NULL DEFAULT 0 CHECK (failure_count >= 0),
    last_failure_class  text,
    last_failure_reason text,
    last_failure_detail text CHECK (length(last_failure_detail) <= 300),
    last_failure_at     timestamptz,
    last_success_at     timestamptz,
    pages               bigint NOT NULL DEFAULT 0,
    issues_delivered    bigint NOT NULL DEFAULT 0,
    updated_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (tenant, registration_key, revision_id),
    FOREIGN KEY (tenant, registration_key, revision_id)
        REFERENCES connector_registrations (tenant, registration_key, revision_id),
    CHECK ((lease_owner IS NULL) = (lease_until IS NULL))
);
-- The poll sensor's and claim's probe: due revisions by time.
CREATE INDEX connector_progress_due ON connector_progress (next_poll_at);
