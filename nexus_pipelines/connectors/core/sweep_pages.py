"""The listing pages a sweep keeps for conditional requests (`connector_sweep_pages`).

A page is kept with its validator only when the provider gave one. The next sweep sends that
validator with the same request; when the provider answers that the page is unchanged, the
kept identities stand in for the page's body, so the comparison with custody runs over the
whole listing every sweep and only the transfer is saved.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import Connection

from nexus_pipelines.connectors.core.registration import Registration
from nexus_pipelines.connectors.core.sweep_values import IdentityPage, IssueIdentity, ListIdentities


def page_key(request: ListIdentities) -> str:
    """The request a page answers: its cursor, or the first page at its size."""
    return request.cursor if request.cursor is not None else f"first;per_page={request.page_size}"


@dataclass(frozen=True)
class KeptPage:
    validator: str
    page: IdentityPage


def load(conn: Connection, registration: Registration) -> dict[str, KeptPage]:
    rows = conn.execute(
        """SELECT page_key, validator, external_refs, updated_ats, excluded, next_cursor FROM connector_sweep_pages
            WHERE (tenant, registration_key, revision_id) = (%s, %s, %s)""",
        (registration.tenant, registration.key, registration.revision_id)).fetchall()
    return {key: KeptPage(validator, IdentityPage(
        identities=tuple(IssueIdentity(external_ref=ref, external_updated_at=at) for ref, at in zip(refs, times)),
        next_cursor=next_cursor, excluded=excluded, validator=validator))
        for key, validator, refs, times, excluded, next_cursor in rows}


def save(conn: Connection, registration: Registration, read: dict[str, IdentityPage], *,
         keep_only: set[str] | None = None) -> None:
    """Keep the pages read in full (a page without a validator drops what was kept for its
    request); with `keep_only` (a complete listing's requests), forget every other page."""
    owner = (registration.tenant, registration.key, registration.revision_id)
    dropped = [key for key, page in read.items() if page.validator is None]
    kept = {key: page for key, page in read.items() if page.validator is not None}
    if dropped:
        conn.execute("""DELETE FROM connector_sweep_pages WHERE (tenant, registration_key, revision_id) = (%s, %s, %s)
                        AND page_key = ANY(%s)""", (*owner, dropped))
    if keep_only is not None:
        conn.execute("""DELETE FROM connector_sweep_pages WHERE (tenant, registration_key, revision_id) = (%s, %s, %s)
                        AND NOT page_key = ANY(%s)""", (*owner, list(keep_only)))
    if not kept:
        return
    conn.cursor().executemany(
            """INSERT INTO connector_sweep_pages (tenant, registration_key, revision_id, page_key, validator,
                                                  external_refs, updated_ats, excluded, next_cursor)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
               ON CONFLICT (tenant, registration_key, revision_id, page_key) DO UPDATE
                  SET validator = EXCLUDED.validator, external_refs = EXCLUDED.external_refs,
                      updated_ats = EXCLUDED.updated_ats, excluded = EXCLUDED.excluded,
                      next_cursor = EXCLUDED.next_cursor, read_at = clock_timestamp()""",
            [(*owner, key, page.validator, [i.external_ref for i in page.identities],
              [i.external_updated_at for i in page.identities], page.excluded, page.next_cursor)
             for key, page in kept.items()])
