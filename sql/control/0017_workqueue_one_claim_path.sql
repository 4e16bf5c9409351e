-- The database enforces the one-active-claim-path rule and the rollback fences.
--
-- * An Event-owned generation has no claimable or running work item, and a
--   WorkItem-owned one has no unfinished or unconfirmed Event execution and no work
--   item awaiting a legacy outcome: checked whenever a generation row is written with a
--   new owner or re-admitted, whenever work items or executions are inserted, and
--   whenever a work item moves back into a claimable state (a replay). So whatever SQL
--   runs, the path that does not own a generation has nothing it could run.
-- * An Event execution starts only while its generation is Event-owned and active, and
--   reaches a terminal outcome only together with its LegacyOutcomeReceipt.
-- * A work item awaiting its legacy outcome changes only by its reconciliation from the
--   latest terminal receipt of its work; a reconciled row is never changed or deleted.
-- The hot paths (claim, renew, complete) only pay a trigger WHEN clause: the update
-- checks are AFTER row triggers (they fail the statement just the same), because a
-- BEFORE row trigger makes PostgreSQL lock every updated row first, WHEN or not (about
-- 5% more WAL per claimed and completed item).

CREATE FUNCTION workqueue_guard_generation_owner() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.claim_path = 'event' THEN
        IF EXISTS (SELECT 1 FROM connector_work_items w
                    WHERE w.registration_id = NEW.registration_id AND w.revision = NEW.revision
                      AND w.state IN ('pending', 'retry', 'running')) THEN
            RAISE EXCEPTION 'generation %@% cannot be Event-owned while it has claimable or running work items',
                NEW.registration_id, NEW.revision USING ERRCODE = 'integrity_constraint_violation';
        END IF;
    ELSE
        IF EXISTS (SELECT 1 FROM event_executions x
                    WHERE x.registration_id = NEW.registration_id AND x.revision = NEW.revision
                      AND x.state IN ('pending', 'started', 'retry', 'unknown')) THEN
            RAISE EXCEPTION 'generation %@% cannot be WorkItem-owned while it has unfinished or unconfirmed Event executions',
                NEW.registration_id, NEW.revision USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        IF EXISTS (SELECT 1 FROM connector_work_items w
                    WHERE w.registration_id = NEW.registration_id AND w.revision = NEW.revision
                      AND w.rollback_fence_id IS NOT NULL AND w.state = 'awaiting_legacy_outcome') THEN
            RAISE EXCEPTION 'generation %@% cannot be WorkItem-owned while fenced work items await their legacy outcome',
                NEW.registration_id, NEW.revision USING ERRCODE = 'integrity_constraint_violation';
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER workqueue_generations_owner_insert BEFORE INSERT ON workqueue_generations
    FOR EACH ROW EXECUTE FUNCTION workqueue_guard_generation_owner();
CREATE TRIGGER workqueue_generations_owner_update BEFORE UPDATE ON workqueue_generations
    FOR EACH ROW WHEN (OLD.claim_path IS DISTINCT FROM NEW.claim_path
                       OR (NEW.status = 'active' AND OLD.status IS DISTINCT FROM 'active'))
    EXECUTE FUNCTION workqueue_guard_generation_owner();

-- Work items inserted for a generation the Event path owns, or for logical work the
-- Event path holds, are refused (one statement-level check per insert statement).
CREATE FUNCTION workqueue_guard_work_item_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    offender record;
BEGIN
    SELECT a.work_id, a.registration_id, a.revision INTO offender
      FROM added a
      JOIN workqueue_generations g ON g.registration_id = a.registration_id AND g.revision = a.revision
     WHERE g.claim_path = 'event' AND a.state IN ('pending', 'retry', 'running')
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'work item % cannot be claimable: generation %@% is Event-owned',
            offender.work_id, offender.registration_id, offender.revision USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    SELECT a.work_id, a.event_id INTO offender
      FROM added a
      JOIN event_executions x ON x.event_id = a.event_id AND x.work_type = a.work_type
     WHERE x.state <> 'transferred' OR x.work_id <> a.work_id
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'work item % duplicates logical work of event % that the Event path holds',
            offender.work_id, offender.event_id USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER connector_work_items_owner_insert AFTER INSERT ON connector_work_items
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION workqueue_guard_work_item_insert();

-- A work item coming back into a claimable state (a replay) needs a WorkItem-owned generation.
CREATE FUNCTION workqueue_guard_work_item_reopen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM workqueue_generations g
                WHERE g.registration_id = NEW.registration_id AND g.revision = NEW.revision
                  AND g.claim_path = 'event') THEN
        RAISE EXCEPTION 'work item % cannot become %: generation %@% is Event-owned',
            NEW.work_id, NEW.state, NEW.registration_id, NEW.revision USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER connector_work_items_owner_reopen AFTER UPDATE ON connector_work_items
    FOR EACH ROW WHEN (NEW.state IN ('pending', 'retry', 'running') AND OLD.state NOT IN ('pending', 'retry', 'running'))
    EXECUTE FUNCTION workqueue_guard_work_item_reopen();

-- Fenced rows: awaiting -> reconciled from the latest terminal receipt only; reconciled is final.
CREATE FUNCTION workqueue_guard_legacy_work_item() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'work item % is % and cannot be deleted', OLD.work_id, OLD.state
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF OLD.state = 'reconciled_legacy_terminal' THEN
        RAISE EXCEPTION 'work item % is reconciled_legacy_terminal (it ran under legacy ownership): it is never reopened, reset or reused',
            OLD.work_id USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.state <> 'reconciled_legacy_terminal'
       OR NEW.rollback_fence_id IS DISTINCT FROM OLD.rollback_fence_id
       OR NEW.event_id <> OLD.event_id OR NEW.work_type <> OLD.work_type
       OR NOT EXISTS (
            SELECT 1 FROM legacy_outcome_receipts r
             WHERE r.work_id = OLD.work_id AND r.version = NEW.legacy_outcome_receipt_version
               AND r.digest = NEW.legacy_outcome_digest AND r.outcome IN ('succeeded', 'failed')
               AND r.rollback_fence_id = OLD.rollback_fence_id
               AND NOT EXISTS (SELECT 1 FROM legacy_outcome_receipts l
                                WHERE l.work_id = r.work_id AND l.version > r.version)) THEN
        RAISE EXCEPTION 'work item % awaits its legacy outcome: only the latest terminal LegacyOutcomeReceipt of its fence can reconcile it',
            OLD.work_id USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER connector_work_items_legacy_update AFTER UPDATE ON connector_work_items
    FOR EACH ROW WHEN (OLD.state IN ('awaiting_legacy_outcome', 'reconciled_legacy_terminal'))
    EXECUTE FUNCTION workqueue_guard_legacy_work_item();
CREATE TRIGGER connector_work_items_legacy_delete BEFORE DELETE ON connector_work_items
    FOR EACH ROW WHEN (OLD.state IN ('awaiting_legacy_outcome', 'reconciled_legacy_terminal'))
    EXECUTE FUNCTION workqueue_guard_legacy_work_item();

-- Event executions: inserted only for an Event-owned generation, and for fenced work
-- only beside its awaiting work item (same work_id and fence).
CREATE FUNCTION workqueue_guard_execution_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    offender record;
BEGIN
    SELECT a.work_id, a.registration_id, a.revision INTO offender
      FROM added a
      LEFT JOIN workqueue_generations g ON g.registration_id = a.registration_id AND g.revision = a.revision
     WHERE g.claim_path IS DISTINCT FROM 'event'
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'event execution % needs an Event-owned generation; %@% is not',
            offender.work_id, offender.registration_id, offender.revision USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    SELECT a.work_id INTO offender
      FROM added a
      JOIN connector_work_items w ON w.event_id = a.event_id AND w.work_type = a.work_type
     WHERE w.work_id <> a.work_id OR w.state <> 'awaiting_legacy_outcome'
        OR w.rollback_fence_id IS DISTINCT FROM a.rollback_fence_id
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'event execution % duplicates a work item that no rollback fence handed to the Event path',
            offender.work_id USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER event_executions_owner_insert AFTER INSERT ON event_executions
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION workqueue_guard_execution_insert();

CREATE FUNCTION workqueue_guard_execution_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
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
CREATE TRIGGER event_executions_transition AFTER UPDATE ON event_executions
    FOR EACH ROW EXECUTE FUNCTION workqueue_guard_execution_update();

CREATE FUNCTION workqueue_undeletable_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% rows cannot be deleted', TG_TABLE_NAME USING ERRCODE = 'integrity_constraint_violation';
END $$;
CREATE TRIGGER event_executions_no_delete BEFORE DELETE ON event_executions
    FOR EACH ROW EXECUTE FUNCTION workqueue_undeletable_row();
CREATE TRIGGER event_executions_no_truncate BEFORE TRUNCATE ON event_executions
    FOR EACH STATEMENT EXECUTE FUNCTION workqueue_undeletable_row();

-- A terminal Event outcome commits only with its receipt (checked at commit).
CREATE FUNCTION workqueue_require_outcome_receipt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
            SELECT 1 FROM legacy_outcome_receipts r
             WHERE r.work_id = NEW.work_id AND r.outcome = NEW.state
               AND NOT EXISTS (SELECT 1 FROM legacy_outcome_receipts l
                                WHERE l.work_id = r.work_id AND l.version > r.version)) THEN
        RAISE EXCEPTION 'event execution % became % without a LegacyOutcomeReceipt saying so', NEW.work_id, NEW.state
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER event_executions_outcome_receipt AFTER UPDATE ON event_executions
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.state IN ('succeeded', 'failed', 'unknown') AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION workqueue_require_outcome_receipt();
