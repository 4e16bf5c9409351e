"""Actors: a credential issued once and stored only as a salted scrypt hash, memberships
that give a role on a registered project, and the page sessions built on them."""

from __future__ import annotations

import re
import uuid

import pytest

from nexus_pipelines.actors import credentials, sessions
from nexus_pipelines.actors.store import (
    ActorError,
    AuthenticationFailed,
    add_actor,
    authenticate,
    grant,
    list_actors,
    memberships,
    reissue,
    revoke,
    role_in,
)
from nexus_pipelines.connectors.core.registration import parse_registration
from nexus_pipelines.connectors.registry import REGISTRY

PROJECT = "acme/actors-project"


@pytest.fixture(scope="module", autouse=True)
def registered_project(control_dsn):
    from nexus_pipelines.control.db import connect

    registration = parse_registration(
        {"key": "actors-reg", "tenant": "acme", "project": "actors-project", "kind": "gitlab",
         "provider": {"base_url": "https://gitlab.example.test", "project_id": 1, "token": "env:T"}},
        REGISTRY, source="actors.yaml")
    with connect(control_dsn) as conn:
        conn.execute(
            """INSERT INTO connector_registrations (tenant, registration_key, revision_id, revision_no, digest,
                                                    connector_kind, schema_id, project, config)
               VALUES ('acme', 'actors-reg', %s, 1, %s, 'gitlab', 'gitlab/v1', 'actors-project', '{}')""",
            (registration.revision_id, registration.digest))


def _name() -> str:
    return f"a-{uuid.uuid4().hex[:8]}"


def _every_row_text(conn) -> str:
    tables = [r[0] for r in conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        " AND table_type = 'BASE TABLE'")]
    return "\n".join(str(row[0]) for table in tables
                     for row in conn.execute(f'SELECT t::text FROM "{table}" t'))  # noqa: S608 - catalog names


def test_the_credential_is_shown_once_and_only_its_salted_scrypt_hash_is_stored(control_conn):
    first, second = _name(), _name()
    text = add_actor(control_conn, first, display_name="First", created_by="test")
    other = add_actor(control_conn, second, display_name="Second", created_by="test")
    credential_id, secret = credentials.parse(text)
    stored = _every_row_text(control_conn)
    assert secret not in stored and text not in stored
    rows = control_conn.execute("SELECT kdf, salt FROM actor_credentials WHERE actor_id = ANY(%s)",
                                ([first, second],)).fetchall()
    assert {r[0] for r in rows} == {credentials.KDF} and rows[0][1] != rows[1][1]
    assert authenticate(control_conn, text).actor_id == first
    assert authenticate(control_conn, other).actor_id == second
    assert re.fullmatch(r"npa\.[0-9a-f]{16}\.[A-Za-z0-9_-]{43}", text)


def test_a_wrong_mistyped_or_replaced_credential_fails_with_one_message(control_conn):
    actor = _name()
    text = add_actor(control_conn, actor, display_name="Someone", created_by="test")
    credential_id, secret = credentials.parse(text)
    wrong_secret = f"npa.{credential_id}.{'A' * 43}"
    unknown_id = f"npa.{'0' * 16}.{secret}"
    messages = set()
    for attempt in (wrong_secret, unknown_id, "not a credential", "", text + "x"):
        with pytest.raises(AuthenticationFailed) as failed:
            authenticate(control_conn, attempt)
        messages.add(str(failed.value))
    assert len(messages) == 1 and secret not in messages.pop()
    renewed = reissue(control_conn, actor, issued_by="test")
    with pytest.raises(AuthenticationFailed):
        authenticate(control_conn, text)
    assert authenticate(control_conn, renewed).actor_id == actor


def test_memberships_need_a_registered_project_and_change_only_by_revocation(control_conn):
    actor = _name()
    principal = authenticate(control_conn, add_actor(control_conn, actor, display_name="M", created_by="test"))
    with pytest.raises(ActorError, match="no registration names project acme/nowhere"):
        grant(control_conn, actor, "acme/nowhere", "commander", granted_by="test")
    with pytest.raises(ActorError, match="is not one of commander, operator"):
        grant(control_conn, actor, PROJECT, "admin", granted_by="test")
    with pytest.raises(ActorError, match="must read tenant/project"):
        grant(control_conn, actor, "actors-project", "operator", granted_by="test")
    assert grant(control_conn, actor, PROJECT, "operator", granted_by="test") == "granted"
    assert grant(control_conn, actor, PROJECT, "operator", granted_by="test") == "unchanged"
    assert grant(control_conn, actor, PROJECT, "commander", granted_by="test") == "changed"
    assert role_in(control_conn, principal, "acme", "actors-project") == "commander"
    assert [m.project_id for m in memberships(control_conn, principal)] == [PROJECT]
    assert revoke(control_conn, actor, PROJECT, revoked_by="test") and not revoke(control_conn, actor, PROJECT,
                                                                                   revoked_by="test")
    assert role_in(control_conn, principal, "acme", "actors-project") is None
    history = control_conn.execute("SELECT role, revoked_at IS NOT NULL FROM project_memberships WHERE actor_id = %s"
                                   " ORDER BY membership_id", (actor,)).fetchall()
    assert history == [("operator", True), ("commander", True)]
    with pytest.raises(Exception, match="change only by being revoked once"):
        control_conn.execute("UPDATE project_memberships SET role = 'operator' WHERE actor_id = %s", (actor,))
    assert next(r for r in list_actors(control_conn) if r.actor_id == actor).memberships == ()


def test_actor_ids_and_duplicates_are_refused_with_one_line(control_conn):
    actor = _name()
    add_actor(control_conn, actor, display_name="Once", created_by="test")
    with pytest.raises(ActorError, match=f"actor {actor} exists"):
        add_actor(control_conn, actor, display_name="Twice", created_by="test")
    with pytest.raises(ActorError, match="lower-case letters"):
        add_actor(control_conn, "Bad Name", display_name="x", created_by="test")
    with pytest.raises(ActorError, match="does not exist"):
        reissue(control_conn, "nobody-here", issued_by="test")


def test_a_session_lasts_until_it_ends_expires_or_its_credential_is_reissued(control_conn):
    actor = _name()
    text = add_actor(control_conn, actor, display_name="S", created_by="test")
    token, principal = sessions.start(control_conn, text)
    assert sessions.resolve(control_conn, token) == principal and token not in _every_row_text(control_conn)
    sessions.end(control_conn, token)
    assert sessions.resolve(control_conn, token) is None
    from datetime import timedelta

    expired, _ = sessions.start(control_conn, text, ttl=timedelta(seconds=-1))
    assert sessions.resolve(control_conn, expired) is None
    live, _ = sessions.start(control_conn, text)
    reissue(control_conn, actor, issued_by="test")
    assert sessions.resolve(control_conn, live) is None
    assert sessions.resolve(control_conn, "forged-token") is None and sessions.resolve(control_conn, None) is None


def test_the_csrf_token_is_bound_to_its_session():
    assert sessions.csrf_ok("session-a", sessions.csrf_token("session-a"))
    assert not sessions.csrf_ok("session-b", sessions.csrf_token("session-a"))
    assert not sessions.csrf_ok("session-a", "") and not sessions.csrf_ok("session-a", None)
