-- The lease index must not serve the fenced hot paths (complete, renew, failures).
--
-- Their predicate `state = 'running' AND lease_until > now()` implies the old index
-- predicate (`state = 'running' AND lease_until IS NOT NULL`), so a generic plan of
-- a prepared completion could drive the update from a scan of *every* running row
-- (estimated at one row from statistics taken while nothing ran) and probe the fence
-- list once per running row: O(running x batch), the slowest statement of a drain
-- with several workers. `lease_owner IS NOT NULL` holds for every running row (the
-- table's CHECK), but the hot paths do not state it, so the planner cannot use this
-- index for them and drives them from the primary key. Lease queries (reclaim, lease
-- counts, drain proofs) state it to keep using the index.
DROP INDEX connector_work_items_leases;
CREATE INDEX connector_work_items_leases
    ON connector_work_items (lease_until)
    WHERE state = 'running' AND lease_owner IS NOT NULL;
