-- One gate per provider origin and credential identity (never the secret: an installation
-- id, a token reference name, an account), shared by every worker and process that calls
-- the provider: while `held_until` is ahead of the database clock no request goes out.
-- `recent_writes` holds the times of the writes of the last minute, for a provider with a
-- proactive write budget (GitHub's content-creating requests per minute).
CREATE TABLE provider_gates (
    gate_key            text PRIMARY KEY CHECK (length(gate_key) BETWEEN 1 AND 400),
    held_until          timestamptz,  -- NULL: never held
    held_by             text NOT NULL DEFAULT '' CHECK (length(held_by) <= 300),
    recent_writes       timestamptz[] NOT NULL DEFAULT '{}',
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- The provider's wait a throttled poll learned, so a manual poll keeps it.
ALTER TABLE connector_progress ADD COLUMN throttled_until timestamptz;
