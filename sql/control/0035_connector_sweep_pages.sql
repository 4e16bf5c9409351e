-- Conditional sweep listings: each listing page a sweep read from a provider that offers
-- conditional requests (GitHub's ETag), with the page's validator and what the page listed.
-- The next sweep sends the validator; a 304 means the page is the one stored here, so the
-- sweep compares this stored listing with custody exactly as if it had read the page again
-- (docs/design/reconciliation-sweep.md). A page whose answer carried no validator is not kept.

CREATE TABLE connector_sweep_pages (
    tenant              text NOT NULL,
    registration_key    text NOT NULL,
    revision_id         text NOT NULL,
    page_key            text NOT NULL,  -- the request: the listing's cursor, or its first page
    validator           text NOT NULL CHECK (length(validator) BETWEEN 1 AND 200),
    external_refs       text[] NOT NULL,
    updated_ats         timestamptz[] NOT NULL,
    excluded            integer NOT NULL CHECK (excluded >= 0),
    next_cursor         text,
    read_at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (tenant, registration_key, revision_id, page_key),
    FOREIGN KEY (tenant, registration_key, revision_id)
        REFERENCES connector_registrations (tenant, registration_key, revision_id),
    CHECK (cardinality(external_refs) = cardinality(updated_ats))
);

-- How many of a sweep's pages the provider answered "not modified".
ALTER TABLE connector_sweeps ADD COLUMN unchanged_pages integer NOT NULL DEFAULT 0 CHECK (unchanged_pages >= 0);
