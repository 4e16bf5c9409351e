-- The lease index must not serve the claim's lane probes: with predicate
-- `state = 'running'` alone, the planner may answer "is this target lane busy?"
-- by scanning every running row instead of probing the partial unique lane index.
-- Queries about leases always constrain lease_until, which implies this predicate.
DROP INDEX connector_work_items_leases;
CREATE INDEX connector_work_items_leases
    ON connector_work_items (lease_until)
    WHERE state = 'running' AND lease_until IS NOT NULL;
