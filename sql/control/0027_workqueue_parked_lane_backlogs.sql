-- A busy target lane's backlog leaves the claim's walk (claims.py, "Parking").
--
-- A claim walks due items in (queue_class, run_after, work_id) order and passes over the
-- ones it cannot take. The items of a target lane that is running one item pile up at the
-- front of that order (they wait while others drain), so every claim walked the whole
-- backlog of a hot lane before it reached the other lanes' items. A claim that meets a
-- busy lane's items more than once parks them: `parked` moves them out of the walk, into
-- an index grouped by target lane, where each claim looks only at the first due item of
-- each parked lane that runs nothing (one probe per parked lane, whatever its backlog).
-- A parked item stays pending (every state rule, count and gate sees it as before) and
-- keeps its place in its source lane; claiming it clears the flag.
ALTER TABLE connector_work_items ADD COLUMN parked boolean NOT NULL DEFAULT false;

-- The walk's index: unparked due items in claim order. Same predicate as before, so the
-- queries that count or list claimable items keep using it.
DROP INDEX connector_work_items_due;
CREATE INDEX connector_work_items_due
    ON connector_work_items (registration_id, revision, parked, queue_class, run_after, work_id)
    WHERE state IN ('pending', 'retry');

-- Parked items by target lane, in claim order within the lane. Holds only parked rows:
-- an item that is never parked adds no entry here.
CREATE INDEX connector_work_items_parked
    ON connector_work_items (registration_id, revision, target_lane_key, queue_class, run_after, work_id)
    WHERE state IN ('pending', 'retry') AND parked;

-- Unparked claimable items by target lane: the walk parks a busy lane's items only when
-- the lane has an earlier unparked one (its first item stays in the walk, so a lane with
-- one waiting item costs a claim one probe and no write), and parks the lane's backlog
-- from here in work_id order.
CREATE INDEX connector_work_items_target_lane
    ON connector_work_items (registration_id, target_lane_key, work_id)
    WHERE state IN ('pending', 'retry') AND target_lane_key IS NOT NULL AND NOT parked;
