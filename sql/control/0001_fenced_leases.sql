-- Fenced leases shared by every domain (writeback job leases, connector
-- registration claims, receipt routers). One row per lease name; the fencing
-- token comes from one sequence, so it strictly increases on every acquisition
-- of any lease, across expiry, release and re-acquisition.
CREATE SEQUENCE fencing_tokens AS bigint;

CREATE TABLE leases (
    lease_name    text PRIMARY KEY,
    owner_id      text NOT NULL,
    fencing_token bigint NOT NULL,
    acquired_at   timestamptz NOT NULL,
    heartbeat_at  timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    CHECK (expires_at > acquired_at)
);
