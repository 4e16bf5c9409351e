-- Fewer WAL bytes per work item on the hot path (claim, completion).
--
-- Neither update can be HOT (`state` is in the partial indexes' predicates), so each
-- new row version gets an entry in every index whose predicate it satisfies, and each
-- entry is a WAL record.

-- One index of running rows instead of two. The source lane's in-flight index (unique
-- per lane) and the lease index held the same running rows twice (the lease index also
-- those without a source lane). A unique index treats NULL keys as distinct, so
-- without `source_lane_key IS NOT NULL` in its predicate it holds every running row
-- and still allows at most one per source lane: the lease queries read it (running
-- rows are few, bounded by what drains hold), and a claim writes one index entry
-- fewer. Its predicate keeps `lease_owner IS NOT NULL` (true of every running row, by
-- the table's CHECK), so the fenced hot paths, which do not state it, stay driven by
-- the primary key (see 0013); the lane probe and the lease queries state it.
CREATE UNIQUE INDEX connector_work_items_running
    ON connector_work_items (registration_id, source_lane_key)
    WHERE state = 'running' AND lease_owner IS NOT NULL;
DROP INDEX connector_work_items_source_inflight;
DROP INDEX connector_work_items_leases;

-- Room on each heap page for the row versions an item writes while it runs. An update
-- whose new version fits on the old version's page logs only the changed middle of the
-- row; one that does not fit first logs a lock on the old version, then the whole new
-- row on another page. At fillfactor 80 most pages ran out of room after a few claims;
-- at 50 a page keeps room for the claim and completion versions of its rows until
-- pruning frees the dead ones. Applies to pages filled from now on.
ALTER TABLE connector_work_items SET (fillfactor = 50);
