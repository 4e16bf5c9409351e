-- Attempt evidence is stored one row per API batch (docs/design/writeback-run.md, "Ledger
-- tables and states"): the batch's time, job, run, batch id and recording transaction once,
-- and each record's attempt as the same position in one array per column. A row per attempt
-- made every batch commit write 200 heap tuples and 200 entries of the transaction-id index
-- (half of its WAL records); a batch row is one heap tuple (its arrays compressed, TOASTed
-- when large) and one index entry.
--
-- outbound_record_attempts becomes a view with the same columns and one row per record per
-- attempt, so the export, the listings and ad-hoc readers are unchanged. Existing rows move
-- into batch rows grouped by everything the batch row holds once, so every row comes back
-- as it was.

CREATE TABLE outbound_attempt_batches (
    attempted_at    timestamptz NOT NULL,
    job_name        text NOT NULL,
    run_id          text NOT NULL,
    batch_id        text NOT NULL,
    recorded_xid    xid8 DEFAULT pg_current_xact_id(),
    external_ids    text[] NOT NULL,
    payload_hashes  text[] NOT NULL,
    attempt_numbers bigint[] NOT NULL,
    statuses        text[] NOT NULL,
    crm_record_ids  text[] NOT NULL,
    http_statuses   bigint[] NOT NULL,
    error_codes     text[] NOT NULL,
    error_messages  text[] NOT NULL,
    duration_ms     bigint[] NOT NULL,
    CHECK (cardinality(external_ids) > 0
           AND cardinality(payload_hashes) = cardinality(external_ids)
           AND cardinality(attempt_numbers) = cardinality(external_ids)
           AND cardinality(statuses) = cardinality(external_ids)
           AND cardinality(crm_record_ids) = cardinality(external_ids)
           AND cardinality(http_statuses) = cardinality(external_ids)
           AND cardinality(error_codes) = cardinality(external_ids)
           AND cardinality(error_messages) = cardinality(external_ids)
           AND cardinality(duration_ms) = cardinality(external_ids)),
    -- the per-attempt NOT NULL and status rules of the row-per-attempt table
    CHECK (array_position(external_ids, NULL) IS NULL AND array_position(payload_hashes, NULL) IS NULL
           AND array_position(attempt_numbers, NULL) IS NULL),
    CHECK (statuses <@ ARRAY['succeeded', 'retryable_failed', 'permanent_failed'])
);

INSERT INTO outbound_attempt_batches (attempted_at, job_name, run_id, batch_id, recorded_xid, external_ids,
    payload_hashes, attempt_numbers, statuses, crm_record_ids, http_statuses, error_codes, error_messages, duration_ms)
SELECT attempted_at, job_name, run_id, batch_id, recorded_xid, array_agg(external_id ORDER BY ctid),
       array_agg(payload_hash ORDER BY ctid), array_agg(attempt_number ORDER BY ctid), array_agg(status ORDER BY ctid),
       array_agg(crm_record_id ORDER BY ctid), array_agg(http_status ORDER BY ctid),
       array_agg(error_code ORDER BY ctid), array_agg(error_message ORDER BY ctid),
       array_agg(duration_ms ORDER BY ctid)
  FROM outbound_record_attempts
 GROUP BY attempted_at, job_name, run_id, batch_id, recorded_xid;

DROP TABLE outbound_record_attempts;

CREATE INDEX outbound_attempt_batches_time ON outbound_attempt_batches USING brin (attempted_at);
CREATE INDEX outbound_attempt_batches_run ON outbound_attempt_batches USING brin (job_name, run_id)
    WITH (autosummarize = on);
CREATE INDEX outbound_attempt_batches_xid ON outbound_attempt_batches (recorded_xid);

-- The same append-only and retention rule, now per batch row (a batch has one time).
CREATE TRIGGER outbound_attempt_batches_append_only
    BEFORE UPDATE OR DELETE ON outbound_attempt_batches
    FOR EACH ROW EXECUTE FUNCTION outbound_attempts_append_only();

CREATE VIEW outbound_record_attempts AS
SELECT b.attempted_at, b.job_name, b.run_id, b.batch_id, a.external_id, a.payload_hash, a.attempt_number, a.status,
       a.crm_record_id, a.http_status, a.error_code, a.error_message, a.duration_ms, b.recorded_xid
  FROM outbound_attempt_batches AS b
 CROSS JOIN LATERAL unnest(b.external_ids, b.payload_hashes, b.attempt_numbers, b.statuses, b.crm_record_ids,
                           b.http_statuses, b.error_codes, b.error_messages, b.duration_ms)
       AS a(external_id, payload_hash, attempt_number, status, crm_record_id, http_status, error_code, error_message,
            duration_ms);

-- Writes through the view keep the evidence rules: an attempt is never rewritten, one
-- inserted by hand becomes a batch of one, and deleting an attempt past the retention
-- deletes its batch (all of a batch's attempts have its one time).
CREATE FUNCTION outbound_record_attempts_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        RAISE EXCEPTION 'outbound_record_attempts is append-only';
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO outbound_attempt_batches (attempted_at, job_name, run_id, batch_id, recorded_xid, external_ids,
            payload_hashes, attempt_numbers, statuses, crm_record_ids, http_statuses, error_codes, error_messages,
            duration_ms)
        VALUES (NEW.attempted_at, NEW.job_name, NEW.run_id, NEW.batch_id, coalesce(NEW.recorded_xid, pg_current_xact_id()),
                ARRAY[NEW.external_id], ARRAY[NEW.payload_hash], ARRAY[NEW.attempt_number], ARRAY[NEW.status],
                ARRAY[NEW.crm_record_id], ARRAY[NEW.http_status], ARRAY[NEW.error_code], ARRAY[NEW.error_message],
                ARRAY[NEW.duration_ms]);
        RETURN NEW;
    END IF;
    DELETE FROM outbound_attempt_batches
     WHERE job_name = OLD.job_name AND batch_id = OLD.batch_id AND attempted_at = OLD.attempted_at;
    RETURN OLD;
END $$;
CREATE TRIGGER outbound_record_attempts_write
    INSTEAD OF INSERT OR UPDATE OR DELETE ON outbound_record_attempts
    FOR EACH ROW EXECUTE FUNCTION outbound_record_attempts_write();
