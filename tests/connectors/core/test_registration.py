"""Registrations: strict, reference-only, revision-pinned; the static registry refuses duplicates."""

from __future__ import annotations

import pytest

from nexus_pipelines.connectors.core.compose import CompositionError, compose
from nexus_pipelines.connectors.core.registration import RegistrationError, from_canonical, parse_registration
from nexus_pipelines.connectors.core.registry import ConnectorRegistry
from nexus_pipelines.connectors.gitlab import SPEC
from nexus_pipelines.connectors.registry import LOCAL_REGISTRATIONS_DIR, REGISTRY, load_registrations
from nexus_pipelines.local.worlds.tokens import gitlab_token


def data(**provider):
    return {"key": "platform", "tenant": "acme", "project": "platform", "kind": "gitlab",
            "provider": {"base_url": "https://gitlab.example.com", "project_id": 42, "token": "env:GITLAB_TOKEN",
                         **provider}}


def test_an_edited_config_is_a_new_revision_and_an_unedited_one_is_not():
    first = parse_registration(data(), REGISTRY, source="a.yaml")
    assert parse_registration(data(), REGISTRY, source="b.yaml").revision_id == first.revision_id
    edited = parse_registration(data(project_id=43), REGISTRY, source="a.yaml")
    assert edited.digest != first.digest and edited.revision_id.startswith("platform@")


@pytest.mark.parametrize("token", [gitlab_token("abcdefghij0123456789"), "hunter2hunter2", "env:lower_case"])
def test_a_credential_must_be_a_reference(token):
    with pytest.raises(RegistrationError) as info:
        parse_registration(data(token=token), REGISTRY, source="a.yaml")
    assert token not in str(info.value)


def test_secret_looking_literals_anywhere_are_refused_without_echoing_them():
    bad = data()
    bad["label_map"] = {"bug": gitlab_token("abcdefghij0123456789")}
    with pytest.raises(RegistrationError, match="registration.label_map.bug looks like a secret") as info:
        parse_registration(bad, REGISTRY, source="a.yaml")
    assert gitlab_token("abcdefghij") not in str(info.value)
    with pytest.raises(RegistrationError, match="provider.base_url looks like a secret"):
        parse_registration(data(base_url="https://user:pass@gitlab.example.com"), REGISTRY, source="a.yaml")


def test_a_readable_key_with_digits_and_dashes_is_a_key_not_a_secret():
    registration = parse_registration({**data(), "key": "gh-rl-secondary-403-retry-after"}, REGISTRY, source="a.yaml")
    assert registration.revision_id.startswith("gh-rl-secondary-403-retry-after@")


@pytest.mark.parametrize("change, message", [
    ({"kind": "svn"}, "unknown connector kind 'svn'"),
    ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
    ({"page_size": 500}, "page_size"),
    ({"key": "Bad Key"}, "key"),
])
def test_invalid_registrations_name_the_field(change, message):
    with pytest.raises(RegistrationError, match=message):
        parse_registration({**data(), **change}, REGISTRY, source="a.yaml")


def test_http_is_allowed_only_to_loopback_in_local_mode():
    with pytest.raises(RegistrationError, match="https"):
        parse_registration(data(base_url="http://gitlab.example.com"), REGISTRY, source="a.yaml")
    with pytest.raises(RegistrationError, match="https"):
        parse_registration(data(base_url="http://127.0.0.1:1"), REGISTRY, source="a.yaml")
    parse_registration(data(base_url="http://127.0.0.1:1", local_mode=True), REGISTRY, source="a.yaml")


def test_the_canonical_config_round_trips_to_the_same_revision_and_holds_no_secret():
    registration = parse_registration(data(), REGISTRY, source="a.yaml")
    canonical = registration.canonical()
    assert canonical["provider"]["token"] == "env:GITLAB_TOKEN"
    assert from_canonical(canonical, REGISTRY).digest == registration.digest


def test_composition_resolves_references_and_names_an_unset_one():
    registration = parse_registration(data(), REGISTRY, source="a.yaml")
    with pytest.raises(CompositionError, match="env:GITLAB_TOKEN names an unset environment variable"):
        compose(registration, REGISTRY, environ={})
    adapter = compose(registration, REGISTRY, environ={"GITLAB_TOKEN": gitlab_token("a-real-looking-token-value")})
    assert "glpat" not in repr(adapter)


def test_the_static_registry_refuses_duplicate_kinds_and_schema_ids():
    with pytest.raises(ValueError, match="registered twice"):
        ConnectorRegistry([SPEC, SPEC])
    with pytest.raises(ValueError, match="schema id"):
        ConnectorRegistry([SPEC, SPEC.__class__(**{**SPEC.__dict__, "kind": "gitlab_two"})])


def test_the_shipped_registrations_load():
    local = load_registrations(LOCAL_REGISTRATIONS_DIR)
    examples = load_registrations(LOCAL_REGISTRATIONS_DIR.parent / "examples")
    assert "acme/demo-gitlab" in local and "acme/platform-gitlab" in examples
    assert all(r.kind in REGISTRY for r in [*local.values(), *examples.values()])
