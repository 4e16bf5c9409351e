-- A second rollback of a generation hands back work that an earlier cutover took from
-- the Event path: its Event execution is 'transferred' (it never reached an outcome and
-- has no LegacyOutcomeReceipt) and its work item, created with the same work_id, is now
-- fenced. The rollback re-arms that execution under the new fence instead of inserting
-- a second one for the same work_id. 'transferred' stays final otherwise: it may become
-- 'pending' again only beside its work item awaiting the legacy outcome under the
-- execution's new fence, in an Event-owned generation, with no receipt for the work yet.

CREATE OR REPLACE FUNCTION workqueue_guard_execution_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    receipt_version integer;
BEGIN
    IF OLD.state = 'transferred' AND NEW.state = 'pending' THEN
        IF NEW.event_id <> OLD.event_id OR NEW.work_type <> OLD.work_type
           OR NEW.registration_id <> OLD.registration_id OR NEW.revision <> OLD.revision
           OR NEW.rollback_fence_id IS NULL
           OR NOT EXISTS (SELECT 1 FROM connector_work_items w
                           WHERE w.work_id = NEW.work_id AND w.state = 'awaiting_legacy_outcome'
                             AND w.rollback_fence_id = NEW.rollback_fence_id)
           OR NOT EXISTS (SELECT 1 FROM workqueue_generations g
                           WHERE g.registration_id = NEW.registration_id AND g.revision = NEW.revision
                             AND g.claim_path = 'event') THEN
            RAISE EXCEPTION 'event execution % is transferred: only a rollback fence that fenced its work item can hand it back to the Event path',
                OLD.work_id USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        SELECT max(r.version) INTO receipt_version FROM legacy_outcome_receipts r WHERE r.work_id = NEW.work_id;
        IF receipt_version IS NOT NULL THEN
            RAISE EXCEPTION 'event execution % is transferred, yet its work has a LegacyOutcomeReceipt (version %) written after the hand-over: its outcome is ambiguous and it is not handed back to the Event path',
                OLD.work_id, receipt_version USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF OLD.state IN ('succeeded', 'failed', 'transferred') THEN
        RAISE EXCEPTION 'event execution % is % and final', OLD.work_id, OLD.state
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF OLD.state = 'unknown' AND NEW.state NOT IN ('succeeded', 'failed') THEN
        RAISE EXCEPTION 'event execution % has an unknown outcome: it can only be confirmed succeeded or failed',
            OLD.work_id USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.state = 'started' AND OLD.state <> 'started' AND NOT EXISTS (
            SELECT 1 FROM workqueue_generations g
             WHERE g.registration_id = NEW.registration_id AND g.revision = NEW.revision
               AND g.claim_path = 'event' AND g.status = 'active') THEN
        RAISE EXCEPTION 'event execution % cannot start: generation %@% is not an active Event-owned generation',
            NEW.work_id, NEW.registration_id, NEW.revision USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;

-- A TRUNCATE skips the row triggers that keep fenced and reconciled work items (0017):
-- a reconciled_legacy_terminal row proves its logical work already ran under legacy
-- ownership and a fence's set is verified against its receipt, so the work items table
-- is never truncated (rows the guards allow to go are deleted row by row).
-- workqueue_replays (the replay audit) holds nothing a fenced or reconciled row needs:
-- a replayed item is never fenced, which its own `replays` count records.
CREATE FUNCTION workqueue_untruncatable_table() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% cannot be truncated: its fenced and reconciled rows are never deleted', TG_TABLE_NAME
        USING ERRCODE = 'integrity_constraint_violation';
END $$;
CREATE TRIGGER connector_work_items_no_truncate BEFORE TRUNCATE ON connector_work_items
    FOR EACH STATEMENT EXECUTE FUNCTION workqueue_untruncatable_table();
