-- Fewer index entries per claim.
--
-- The source-lane head index no longer holds running rows: a claim (pending -> running)
-- is not a HOT update (state is in the partial predicates), so every index whose
-- predicate the running row satisfies gets a new entry. Running items of a lane are
-- already in the partial unique index connector_work_items_source_inflight (at most
-- one per lane), so the head check probes that index for "a running item in the lane"
-- and this one for "a lower pending / retry item in the lane" (claims.py).
DROP INDEX connector_work_items_source_lane;
CREATE INDEX connector_work_items_source_lane
    ON connector_work_items (registration_id, source_lane_key, work_id)
    WHERE state IN ('pending', 'retry') AND source_lane_key IS NOT NULL;

-- Room on each heap page for the claim's and the completion's new row versions: an
-- update whose new version stays on the old version's page logs a smaller WAL record
-- (and needs no second page). Applies to pages filled from now on.
ALTER TABLE connector_work_items SET (fillfactor = 80);
