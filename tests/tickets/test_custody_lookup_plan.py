"""A round's custody lookup probes the links' key for each version; it never reads every link,
whatever the statistics of the custody table say."""

from __future__ import annotations

import json

import psycopg
import pytest

from nexus_pipelines.control.db import connect
from nexus_pipelines.tickets.intake import DEFAULT_PRIORITY, INTAKE_ACTOR, _CREATE

LINKS = 5000


def _link(conn, first: int, count: int) -> None:
    conn.execute(
        """WITH t AS (
               INSERT INTO tickets (tenant, project, title, description, source_state, source_updated_at, source_digest)
               SELECT 'acme', 'p', 't' || g, '', 'open', now(), 'd' || g FROM generate_series(%(first)s::int, %(last)s::int) g
               RETURNING ticket_id, title)
           INSERT INTO ticket_custody_links (tenant, registration_key, external_ref, ticket_id, connector_kind,
                                             display_url, linked_by_work_id)
           SELECT 'acme', 'main', 'gitlab:p:' || ticket_id, ticket_id, 'gitlab', 'https://x', 0 FROM t""",
        {"first": first, "last": first + count - 1})


def _custody_scans(conn) -> list[str]:
    """The scan nodes of the create statement's plan that read `ticket_custody_links`."""
    rows = [{"idx": n, "tenant": "acme", "key": "main", "ref": f"gitlab:p:{n + 1}"} for n in range(60)]
    cur = psycopg.ClientCursor(conn)
    cur.execute("EXPLAIN (FORMAT JSON) " + _CREATE,
                {"rows": json.dumps(rows), "priority": DEFAULT_PRIORITY, "actor": INTAKE_ACTOR})
    found: list[str] = []

    def walk(node: dict) -> None:
        if node.get("Relation Name") == "ticket_custody_links" and "Scan" in node["Node Type"]:
            found.append(node["Node Type"])
        for child in node.get("Plans", []):
            walk(child)

    walk(cur.fetchone()[0][0]["Plan"])
    return found


@pytest.fixture(scope="module")
def conn(control_dsn):
    with connect(control_dsn) as conn:
        for table in ("tickets", "ticket_custody_links"):  # the test decides when statistics are taken
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        yield conn


def test_the_custody_lookup_probes_the_key_on_links_never_analyzed(conn):
    _link(conn, 1, LINKS)
    scans = _custody_scans(conn)
    assert scans and "Seq Scan" not in scans and "Bitmap Heap Scan" not in scans


def test_the_custody_lookup_probes_the_key_once_the_links_are_analyzed(conn):
    conn.execute("ANALYZE ticket_custody_links")
    _link(conn, LINKS + 1, LINKS)  # and the table has grown since
    scans = _custody_scans(conn)
    assert scans and "Seq Scan" not in scans and "Bitmap Heap Scan" not in scans
    conn.execute("ANALYZE ticket_custody_links")
    scans = _custody_scans(conn)
    assert scans and "Seq Scan" not in scans and "Bitmap Heap Scan" not in scans
