-- Items behind a waiting head of their source lane leave the claim's walk (claims.py,
-- "Behind").
--
-- An item behind a claimable item of its source lane cannot run before it. Such items stayed
-- in the walk and every claim passed over them, a head probe each: with many source lanes
-- crossing many target lanes they became most of the queue, and a 100,000-item drain fell
-- from about 14,000 items/s to as little as 164. A claim now marks the ones it meets
-- `behind` (and of a busy target lane's backlog, the items that are not their lane's head):
-- out of the walk's index and the parked lanes' index, into one by source lane, where a
-- claim looks only at each lane's first behind item and takes it once it is the lane's head.
-- Claiming the item clears the flag; nothing else writes it.
ALTER TABLE connector_work_items ADD COLUMN behind boolean NOT NULL DEFAULT false;

-- The walk's index: unparked items not behind, in claim order (the flags are key columns,
-- so the queries that count or list claimable items keep using it).
DROP INDEX connector_work_items_due;
CREATE INDEX connector_work_items_due
    ON connector_work_items (registration_id, revision, parked, behind, queue_class, run_after, work_id)
    WHERE state IN ('pending', 'retry');

-- The parked lanes' index holds no behind item: a parked lane's first item is then mostly its
-- source lane's head, not a follower the claim probes and passes over.
DROP INDEX connector_work_items_parked;
CREATE INDEX connector_work_items_parked
    ON connector_work_items (registration_id, revision, target_lane_key, queue_class, run_after, work_id)
    WHERE state IN ('pending', 'retry') AND parked AND NOT behind;

-- Behind items by source lane, in lane order: a claim reads each lane's first one. The lanes
-- in the order of their key's hash, so that a claim can start at a random point of that ring.
CREATE INDEX connector_work_items_behind
    ON connector_work_items (registration_id, hashtextextended(source_lane_key, 0), source_lane_key, work_id)
    WHERE state IN ('pending', 'retry') AND behind;
