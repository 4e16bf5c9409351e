-- The ledger export appends to BigQuery only the attempts committed since its last export.
-- "Since" is exact with Postgres snapshots: each attempt records the transaction that
-- inserted it, and a row belongs to the export whose snapshot first sees that transaction
-- committed (a clock bound would miss a row whose transaction committed after a later one).
-- Rows written before this migration have no id; the first export of a dataset takes them.
-- ADD COLUMN without a default and SET DEFAULT afterwards: no table rewrite, no long lock.
ALTER TABLE outbound_record_attempts ADD COLUMN recorded_xid xid8;
ALTER TABLE outbound_record_attempts ALTER COLUMN recorded_xid SET DEFAULT pg_current_xact_id();
CREATE INDEX outbound_record_attempts_xid ON outbound_record_attempts (recorded_xid);

-- One row per BigQuery destination table of an incremental export. `exported`: every
-- attempt visible in this snapshot is in BigQuery. `pending`: an export up to this snapshot
-- was started; its rows carry export_id = pending_id in BigQuery, so an export that died
-- after its load job but before recording it is undone by that id and done again.
CREATE TABLE ledger_export_marks (
    destination text PRIMARY KEY,
    exported    pg_snapshot,
    pending     pg_snapshot,
    pending_id  text,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((pending IS NULL) = (pending_id IS NULL))
);
