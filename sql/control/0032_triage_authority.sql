-- Triage and priority authority for connector tickets (seed 002 phase 3: CX-13, CX-14, CX-15).
-- Actors authenticate with a credential of which only a KDF hash is stored; project
-- memberships give them a role; every triage or priority decision is one recorded command
-- whose facts carry the actor and the role the server derived. Facts are append-only.

-- A project is what a registration names: its tickets belong to it.
CREATE VIEW projects AS SELECT DISTINCT tenant, project FROM connector_registrations;

CREATE TABLE actors (
    actor_id            text PRIMARY KEY CHECK (actor_id ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    display_name        text NOT NULL CHECK (length(display_name) BETWEEN 1 AND 100),
    created_by          text NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TRIGGER actors_immutable BEFORE UPDATE OR DELETE ON actors
    FOR EACH ROW EXECUTE FUNCTION tickets_append_only();

-- Only the KDF output and its parameters: the credential itself is shown once, at issue.
CREATE TABLE actor_credentials (
    credential_id       text PRIMARY KEY CHECK (credential_id ~ '^[0-9a-f]{16}$'),
    actor_id            text NOT NULL REFERENCES actors (actor_id),
    kdf                 text NOT NULL,
    salt                bytea NOT NULL CHECK (length(salt) >= 16),
    hash                bytea NOT NULL CHECK (length(hash) >= 32),
    issued_by           text NOT NULL,
    issued_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    revoked_at          timestamptz
);
CREATE UNIQUE INDEX actor_credentials_one_live ON actor_credentials (actor_id) WHERE revoked_at IS NULL;

-- Memberships and credentials change only by being revoked, once.
CREATE FUNCTION revoke_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR OLD.revoked_at IS NOT NULL OR NEW.revoked_at IS NULL
       OR (to_jsonb(NEW) - 'revoked_at' - 'revoked_by') IS DISTINCT FROM (to_jsonb(OLD) - 'revoked_at' - 'revoked_by') THEN
        RAISE EXCEPTION '% rows change only by being revoked once', TG_TABLE_NAME
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER actor_credentials_revoke_only BEFORE UPDATE OR DELETE ON actor_credentials
    FOR EACH ROW EXECUTE FUNCTION revoke_only();

CREATE TABLE project_memberships (
    membership_id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant              text NOT NULL,
    project             text NOT NULL,
    actor_id            text NOT NULL REFERENCES actors (actor_id),
    role                text NOT NULL CHECK (role IN ('commander', 'operator')),
    granted_by          text NOT NULL,
    granted_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    revoked_by          text,
    revoked_at          timestamptz,
    CHECK ((revoked_by IS NULL) = (revoked_at IS NULL))
);
CREATE UNIQUE INDEX project_memberships_one_live ON project_memberships (tenant, project, actor_id)
    WHERE revoked_at IS NULL;
CREATE TRIGGER project_memberships_revoke_only BEFORE UPDATE OR DELETE ON project_memberships
    FOR EACH ROW EXECUTE FUNCTION revoke_only();

-- Signed-in sessions of the pages: the cookie holds a random token, the table its sha256.
CREATE TABLE actor_sessions (
    session_hash        text PRIMARY KEY CHECK (session_hash ~ '^[0-9a-f]{64}$'),
    actor_id            text NOT NULL REFERENCES actors (actor_id),
    credential_id       text NOT NULL REFERENCES actor_credentials (credential_id),
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at          timestamptz NOT NULL,
    ended_at            timestamptz
);
CREATE INDEX actor_sessions_actor ON actor_sessions (actor_id);

-- One row per accepted command: its idempotency key, authenticated actor, derived role,
-- canonical arguments and result. A replay returns `result`; other arguments are refused.
CREATE TABLE ticket_commands (
    command_seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    client_command_id   text NOT NULL UNIQUE CHECK (length(client_command_id) BETWEEN 1 AND 200),
    command             text NOT NULL CHECK (command IN ('triage_connector_ticket', 'set_connector_ticket_priority')),
    ticket_id           bigint NOT NULL REFERENCES tickets (ticket_id),
    actor_id            text NOT NULL REFERENCES actors (actor_id),
    actor_role          text NOT NULL CHECK (actor_role IN ('commander', 'operator')),
    arguments           jsonb NOT NULL,
    result              jsonb NOT NULL,
    recorded_at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ticket_commands_ticket ON ticket_commands (ticket_id, command_seq);
CREATE TRIGGER ticket_commands_immutable BEFORE UPDATE OR DELETE ON ticket_commands
    FOR EACH ROW EXECUTE FUNCTION tickets_append_only();

-- Actor decisions name their command and role; intake's automatic facts name neither.
ALTER TABLE ticket_priority_facts
    ADD COLUMN actor_role text CHECK (actor_role IN ('commander', 'operator')),
    ADD COLUMN command_seq bigint REFERENCES ticket_commands (command_seq),
    ADD CONSTRAINT ticket_priority_facts_attributed CHECK ((actor_role IS NULL) = (command_seq IS NULL));
ALTER TABLE ticket_triage_facts
    ADD COLUMN actor_role text CHECK (actor_role = 'commander'),
    ADD COLUMN command_seq bigint REFERENCES ticket_commands (command_seq),
    ADD CONSTRAINT ticket_triage_facts_attributed CHECK ((actor_role IS NULL) = (command_seq IS NULL));

-- The duplicates relation a DUPLICATE disposition appends (one per duplicate ticket).
CREATE TABLE ticket_relations (
    relation_id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ticket_id           bigint NOT NULL REFERENCES tickets (ticket_id),
    relation            text NOT NULL CHECK (relation = 'duplicates'),
    related_ticket_id   bigint NOT NULL REFERENCES tickets (ticket_id),
    command_seq         bigint NOT NULL REFERENCES ticket_commands (command_seq),
    recorded_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (ticket_id, relation),
    CHECK (related_ticket_id <> ticket_id)
);
CREATE TRIGGER ticket_relations_immutable BEFORE UPDATE OR DELETE ON ticket_relations
    FOR EACH ROW EXECUTE FUNCTION tickets_append_only();

-- Attention: human waiting. Intake opens one commander-owned finding per connector ticket;
-- the commander's triage resolves it. Nothing expires or dismisses it.
CREATE TABLE attention_findings (
    finding_id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind                text NOT NULL CHECK (kind = 'connector_triage_required'),
    owner_role          text NOT NULL CHECK (owner_role = 'commander'),
    tenant              text NOT NULL,
    project             text NOT NULL,
    ticket_id           bigint NOT NULL REFERENCES tickets (ticket_id),
    opened_by           text NOT NULL,
    opened_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (ticket_id, kind)
);
CREATE INDEX attention_findings_opened ON attention_findings (tenant, project, opened_at);
CREATE TRIGGER attention_findings_immutable BEFORE UPDATE OR DELETE ON attention_findings
    FOR EACH ROW EXECUTE FUNCTION tickets_append_only();

CREATE TABLE attention_resolutions (
    finding_id          bigint PRIMARY KEY REFERENCES attention_findings (finding_id),
    command_seq         bigint NOT NULL REFERENCES ticket_commands (command_seq),
    disposition         text NOT NULL CHECK (disposition IN ('ACCEPTED', 'DUPLICATE', 'REJECTED')),
    resolved_at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TRIGGER attention_resolutions_immutable BEFORE UPDATE OR DELETE ON attention_resolutions
    FOR EACH ROW EXECUTE FUNCTION tickets_append_only();

-- Backfill: every open, untriaged connector ticket of phase 1 waits for its commander
-- since it was created.
INSERT INTO attention_findings (kind, owner_role, tenant, project, ticket_id, opened_by, opened_at)
SELECT 'connector_triage_required', 'commander', t.tenant, t.project, t.ticket_id, 'migration:0032', t.created_at
  FROM tickets t JOIN ticket_custody_links l USING (ticket_id)
 WHERE t.triage_state = 'UNTRIAGED' AND t.status = 'open'
 ORDER BY t.ticket_id;
