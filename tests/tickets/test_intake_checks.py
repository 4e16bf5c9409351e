"""The custody link's external_ref check and the observation's digest check admit exactly the
values the counted-repeat patterns they replaced admit (those patterns are the rule; the
checks are cheaper forms of it)."""

from __future__ import annotations

import psycopg
import pytest

from nexus_pipelines.control.db import connect

REF_RULE = "^[a-z][a-z0-9_]{1,31}:[A-Za-z0-9._-]{1,128}:[A-Za-z0-9._-]{1,128}$"
DIGEST_RULE = "^sha256:[0-9a-f]{64}$"

REFS = [
    "gitlab:278964:1", "jira:cloud-1:PROJ-12", "github:R_kgDO.x_y-z:42",
    "g" + "a" * 31 + ":p:1", "g" + "a" * 32 + ":p:1",  # a kind of 32 characters, and of 33
    "gitlab:" + "p" * 128 + ":1", "gitlab:" + "p" * 129 + ":1",
    "gitlab:p:" + "9" * 128, "gitlab:p:" + "9" * 129,
    "g:p:1", "gl:p:1", "Gitlab:p:1", "1gitlab:p:1", "gitlab::1", "gitlab:p:", "gitlab:p", "gitlab:p:1:2",
    "gitlab:p:1\n", "gitlab:p/q:1", "gitlab:pé:1", "gitlab: p:1", "",
]
DIGESTS = [
    "sha256:" + "0" * 64, "sha256:" + "ab" * 32, "sha256:" + "0" * 63, "sha256:" + "0" * 65,
    "sha256:" + "A" * 64, "sha256:" + "g" * 64, "sha512:" + "0" * 64, "sha256:" + "é" * 64,
    "sha256:" + "0" * 63 + "\n", "xsha256:" + "0" * 63, "",
]


@pytest.fixture(scope="module")
def conn(control_dsn):
    with connect(control_dsn) as conn:
        (ticket_id,) = conn.execute(
            """INSERT INTO tickets (tenant, project, title, description, source_state, source_updated_at, source_digest)
               VALUES ('acme', 'p', 't', '', 'open', now(), 'd') RETURNING ticket_id""").fetchone()
        conn.ticket_id = ticket_id
        yield conn


def _admitted(conn, statement: str, params: tuple) -> bool:
    try:
        with conn.transaction():
            conn.execute(statement, params)
            raise psycopg.Rollback()  # each value is tried on its own
    except psycopg.errors.CheckViolation:
        return False
    return True


def _rule(conn, value: str, rule: str) -> bool:
    return conn.execute("SELECT %s ~ %s", (value, rule)).fetchone()[0]


@pytest.mark.parametrize("ref", REFS)
def test_a_custody_link_admits_an_external_ref_exactly_when_the_counted_pattern_does(conn, ref):
    admitted = _admitted(conn, """INSERT INTO ticket_custody_links (tenant, registration_key, external_ref, ticket_id,
                                                                    connector_kind, display_url, linked_by_work_id)
                                  VALUES ('acme', 'main', %s, %s, 'gitlab', 'https://x', 0)""", (ref, conn.ticket_id))
    assert admitted is _rule(conn, ref, REF_RULE)


@pytest.mark.parametrize("digest", DIGESTS)
def test_an_observation_admits_a_digest_exactly_when_the_counted_pattern_does(conn, digest):
    admitted = _admitted(conn, """INSERT INTO ticket_observations (ticket_id, external_ref, source_digest,
                                                                   source_updated_at, issue, work_id, work_token)
                                  VALUES (%s, 'gitlab:p:1', %s, now(), '{}', 0, 0)""", (conn.ticket_id, digest))
    assert admitted is _rule(conn, digest, DIGEST_RULE)


def test_the_cases_cover_values_each_pattern_admits_and_refuses(conn):
    for values, rule in ((REFS, REF_RULE), (DIGESTS, DIGEST_RULE)):
        assert {_rule(conn, v, rule) for v in values} == {True, False}
