"""The triage-authority migration (0032) gives every open, untriaged ticket created before it
its unresolved commander finding, aged from the ticket's creation; finished tickets get none."""

from __future__ import annotations

import shutil

from nexus_pipelines.control.db import connect
from nexus_pipelines.control.migrations import MIGRATIONS_DIR, apply_migrations

_TICKET = """
WITH t AS (
    INSERT INTO tickets (tenant, project, title, description, status, triage_state, source_state, source_updated_at,
                         source_digest, created_at)
    VALUES ('acme', 'platform', %(title)s, '', %(status)s, 'UNTRIAGED', 'open', now(), 'sha256:x',
            now() - interval '3 days') RETURNING ticket_id)
INSERT INTO ticket_custody_links (tenant, registration_key, external_ref, ticket_id, connector_kind, display_url,
                                  linked_by_work_id)
SELECT 'acme', 'old', 'gitlab:1:' || ticket_id, ticket_id, 'gitlab', 'https://gitlab.example.test', 1 FROM t
RETURNING ticket_id"""


def test_tickets_from_before_triage_authority_get_their_finding_when_it_is_migrated(empty_dsn, tmp_path):
    before = tmp_path / "before_triage_authority"
    before.mkdir()
    for path in MIGRATIONS_DIR.glob("*.sql"):
        if int(path.name[:4]) <= 31:
            shutil.copy(path, before / path.name)
    apply_migrations(empty_dsn, directory=before)
    with connect(empty_dsn) as conn:
        created = {status: conn.execute(_TICKET, {"title": status, "status": status}).fetchone()[0]
                   for status in ("open", "done")}
    assert "0032_triage_authority.sql" in apply_migrations(empty_dsn)
    with connect(empty_dsn) as conn:
        rows = conn.execute(
            """SELECT ticket_id, kind, owner_role, opened_by, opened_at = t.created_at
                 FROM attention_findings f JOIN tickets t USING (ticket_id, tenant, project)""").fetchall()
    assert rows == [(created["open"], "connector_triage_required", "commander", "migration:0032", True)]
