-- Immutable rows stay: events (the immutable fact ledger) and generation receipts
-- (the durable activation / quiesce / drain proofs) rejected UPDATE only, so a DELETE
-- could remove a generation's activation or drain proof (or an event's fact) while
-- the generation stayed claimable. Reject DELETE and TRUNCATE as well.
CREATE TRIGGER connector_outbox_events_no_delete BEFORE DELETE ON connector_outbox_events
    FOR EACH ROW EXECUTE FUNCTION workqueue_immutable_row();
CREATE TRIGGER connector_outbox_events_no_truncate BEFORE TRUNCATE ON connector_outbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION workqueue_immutable_row();
CREATE TRIGGER workqueue_generation_receipts_no_delete BEFORE DELETE ON workqueue_generation_receipts
    FOR EACH ROW EXECUTE FUNCTION workqueue_immutable_row();
CREATE TRIGGER workqueue_generation_receipts_no_truncate BEFORE TRUNCATE ON workqueue_generation_receipts
    FOR EACH STATEMENT EXECUTE FUNCTION workqueue_immutable_row();
