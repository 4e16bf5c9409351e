-- NexusCRM writeback ledger (seed 004 section 10), in the control plane.
-- Same tables, columns and states as the seed; the job lease is the shared fenced
-- lease (`leases` row named 'writeback:<job_name>'), shown with the seed's columns
-- by the view outbound_job_leases.

CREATE VIEW outbound_job_leases AS
SELECT substr(lease_name, length('writeback:') + 1) AS job_name,
       owner_id      AS owner_run_id,
       acquired_at,
       heartbeat_at,
       expires_at,
       fencing_token
  FROM leases
 WHERE lease_name LIKE 'writeback:%';

CREATE TABLE outbound_runs (
    job_name                text NOT NULL,
    run_id                  text NOT NULL,
    source_run_id           text,
    source_cutoff_at        timestamptz,
    status                  text NOT NULL CHECK (status IN
        ('running', 'succeeded', 'completed_with_errors', 'failed', 'dry_run', 'skipped_already_running')),
    selected_rows           bigint,
    unchanged_rows          bigint,
    succeeded_rows          bigint,
    retryable_failed_rows   bigint,
    permanently_failed_rows bigint,
    started_at              timestamptz NOT NULL,
    ended_at                timestamptz,
    error_message           text,
    -- beyond the seed: replay options and progress
    dry_run                 boolean NOT NULL DEFAULT false,
    options                 jsonb NOT NULL DEFAULT '{}'::jsonb,
    batches                 integer NOT NULL DEFAULT 0,
    crm_calls               integer NOT NULL DEFAULT 0,
    lease_token             bigint,
    PRIMARY KEY (job_name, run_id)
);
CREATE INDEX outbound_runs_started ON outbound_runs (job_name, started_at DESC);

CREATE TABLE outbound_records (
    job_name            text NOT NULL,
    target_object       text NOT NULL,
    external_id         text NOT NULL,
    payload_hash        text NOT NULL,
    source_version      text,
    crm_record_id       text,
    status              text NOT NULL CHECK (status IN ('succeeded', 'retryable_failed', 'permanent_failed')),
    attempt_count       bigint NOT NULL CHECK (attempt_count >= 0),
    last_attempt_run_id text,
    last_success_run_id text,
    next_retry_at       timestamptz,
    error_code          text,
    error_message       text,
    updated_at          timestamptz NOT NULL,
    PRIMARY KEY (job_name, target_object, external_id)
);
CREATE INDEX outbound_records_retryable ON outbound_records (job_name, target_object, next_retry_at)
    WHERE status = 'retryable_failed';

-- Append-only attempt evidence; pruned after 90 days (see writeback.ledger.prune_attempts).
CREATE TABLE outbound_record_attempts (
    attempted_at   timestamptz NOT NULL,
    job_name       text NOT NULL,
    run_id         text NOT NULL,
    batch_id       text NOT NULL,
    external_id    text NOT NULL,
    payload_hash   text NOT NULL,
    attempt_number bigint NOT NULL,
    status         text NOT NULL CHECK (status IN ('succeeded', 'retryable_failed', 'permanent_failed')),
    crm_record_id  text,
    http_status    bigint,
    error_code     text,
    error_message  text,
    duration_ms    bigint
);
CREATE INDEX outbound_record_attempts_time ON outbound_record_attempts USING brin (attempted_at);
CREATE INDEX outbound_record_attempts_run ON outbound_record_attempts (job_name, run_id);

CREATE FUNCTION outbound_attempts_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Evidence is never rewritten; only retention pruning deletes (old rows).
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'outbound_record_attempts is append-only';
    END IF;
    IF OLD.attempted_at > clock_timestamp() - interval '90 days' THEN
        RAISE EXCEPTION 'outbound_record_attempts rows younger than the 90-day retention cannot be deleted';
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER outbound_record_attempts_append_only
    BEFORE UPDATE OR DELETE ON outbound_record_attempts
    FOR EACH ROW EXECUTE FUNCTION outbound_attempts_append_only();
