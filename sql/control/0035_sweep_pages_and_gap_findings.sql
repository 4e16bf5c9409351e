-- Conditional sweep listings, and every sweep gap on the Attention page.
--
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

-- Every re-observed gap is an Attention finding for its project's commander, on any ticket:
-- one per re-observed version (the `ticket.observe` work item that applied it), so a second
-- gap on a ticket is a second finding. Triage resolves the gap findings of an untriaged
-- ticket; on any ticket the commander resolves them with `acknowledge_sweep_gap`.
ALTER TABLE attention_findings DROP CONSTRAINT attention_findings_ticket_id_kind_key;
ALTER TABLE attention_findings ADD COLUMN work_id bigint;  -- for a sweep gap: the work item that re-observed it
CREATE UNIQUE INDEX attention_findings_one_triage ON attention_findings (ticket_id)
    WHERE kind = 'connector_triage_required';
CREATE UNIQUE INDEX attention_findings_one_per_gap ON attention_findings (work_id)
    WHERE kind = 'connector_sweep_gap';
CREATE INDEX attention_findings_ticket ON attention_findings (ticket_id, finding_id);

ALTER TABLE attention_resolutions DROP CONSTRAINT attention_resolutions_disposition_check;
ALTER TABLE attention_resolutions ADD CONSTRAINT attention_resolutions_disposition_check
    CHECK (disposition IN ('ACCEPTED', 'DUPLICATE', 'REJECTED', 'ACKNOWLEDGED'));
ALTER TABLE ticket_commands DROP CONSTRAINT ticket_commands_command_check;
ALTER TABLE ticket_commands ADD CONSTRAINT ticket_commands_command_check
    CHECK (command IN ('triage_connector_ticket', 'set_connector_ticket_priority', 'acknowledge_sweep_gap'));
