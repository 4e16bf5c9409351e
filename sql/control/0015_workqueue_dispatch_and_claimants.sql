-- The dispatch record of work items, the claim-path owner column of generations and
-- the registry of running drains (seed 000, gates 4 and 5; used by claims.py).

-- Generations get an owner column (the Event path's tables and rules follow in 0016
-- and 0017); a claim admits only WorkItem-owned generations, and the time a rollback
-- disabled a generation's claims is recorded.
ALTER TABLE workqueue_generations ADD COLUMN claim_path text NOT NULL DEFAULT 'work_item';
ALTER TABLE workqueue_generations ADD COLUMN claims_disabled_at timestamptz;

-- Work items: the dispatch record.
-- A claim counts an attempt; `unstarted_attempts` counts the claimed attempts whose
-- handler provably never started (the drain handed them back unstarted). So
-- attempts - unstarted_attempts attempts may have dispatched, and an attempt whose
-- holder died counts as dispatched (fail closed).
ALTER TABLE connector_work_items ADD COLUMN unstarted_attempts integer NOT NULL DEFAULT 0;
ALTER TABLE connector_work_items ADD CONSTRAINT connector_work_items_unstarted_check
    CHECK (unstarted_attempts BETWEEN 0 AND attempts);

-- WorkItem drains register while they run, so a rollback can prove that no drain that
-- was running when it disabled claims is still running (the seed's zero claim-capable
-- processes; the Event path's scheduler lease is its own registry). A row whose
-- expires_at has passed is a dead drain.
CREATE TABLE workqueue_claimants (
    claimant_id         text PRIMARY KEY,
    registration_ids    text[],                                   -- NULL: every registration
    started_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at          timestamptz NOT NULL
);

