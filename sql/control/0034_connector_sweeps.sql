-- Reconciliation sweeps: each sweep of a registration and every gap it found between the
-- provider's listing and custody. A gap is an issue the incremental scans missed (no
-- custody) or whose newest provider version was never observed; the sweep re-observes it
-- through the normal receipt path, and its ticket carries a `connector_sweep_gap` finding.

CREATE TABLE connector_sweeps (
    sweep_id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant              text NOT NULL,
    registration_key    text NOT NULL,
    revision_id         text NOT NULL,
    outcome             text NOT NULL CHECK (outcome IN ('complete', 'partial', 'failed', 'lease_busy')),
    listed              integer NOT NULL CHECK (listed >= 0),
    excluded            integer NOT NULL CHECK (excluded >= 0),
    gaps                integer NOT NULL CHECK (gaps >= 0),
    reobserved          integer NOT NULL CHECK (reobserved >= 0),
    pages               integer NOT NULL CHECK (pages >= 0),
    calls               integer NOT NULL CHECK (calls >= 0),
    detail              text NOT NULL DEFAULT '' CHECK (length(detail) <= 300),
    started_at          timestamptz NOT NULL,
    finished_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    FOREIGN KEY (tenant, registration_key, revision_id)
        REFERENCES connector_registrations (tenant, registration_key, revision_id)
);
CREATE INDEX connector_sweeps_latest ON connector_sweeps (tenant, registration_key, sweep_id DESC);

CREATE TABLE connector_sweep_gaps (
    sweep_id            bigint NOT NULL REFERENCES connector_sweeps (sweep_id),
    external_ref        text NOT NULL,
    listed_updated_at   timestamptz NOT NULL,
    reason              text NOT NULL CHECK (reason IN ('missing', 'stale')),
    reobserved          boolean NOT NULL,
    PRIMARY KEY (sweep_id, external_ref)
);
CREATE TRIGGER connector_sweeps_immutable BEFORE UPDATE OR DELETE ON connector_sweeps
    FOR EACH ROW EXECUTE FUNCTION tickets_append_only();
CREATE TRIGGER connector_sweep_gaps_immutable BEFORE UPDATE OR DELETE ON connector_sweep_gaps
    FOR EACH ROW EXECUTE FUNCTION tickets_append_only();

-- A re-observed gap is visible on the ticket pages until its commander triages the ticket.
ALTER TABLE attention_findings DROP CONSTRAINT attention_findings_kind_check;
ALTER TABLE attention_findings ADD CONSTRAINT attention_findings_kind_check
    CHECK (kind IN ('connector_triage_required', 'connector_sweep_gap'));
