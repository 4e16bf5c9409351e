"""The one redaction rule and credential references."""

from __future__ import annotations

import base64
from urllib.parse import quote, quote_plus

import pytest

from nexus_pipelines.credentials import SecretReferenceError, check_reference, resolve
from nexus_pipelines.redaction import basic_credentials, describe_exception, looks_like_secret, one_line, redact
from nexus_pipelines.local.worlds.tokens import atlassian_token, github_token, gitlab_token, pem_block


@pytest.mark.parametrize(
    "text, secret",
    [
        ("GET https://user:hunter2pass@gitlab.example.com/api", "hunter2pass"),
        ("Authorization: Bearer abc.def.ghi-123456", "abc.def.ghi-123456"),
        (f"PRIVATE-TOKEN: {gitlab_token('abcdefghij0123456789')}", gitlab_token("abcdefghij0123456789")),
        ("token eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiIxIn0.c2lnbmF0dXJl", "eyJhbGciOiJSUzI1NiJ9"),
        ("KeyError: {'password': 'hunter2', 'api_key': 'sk1234'}", "hunter2"),
        ("bad request api_key='abc123' token='zzz9'", "abc123"),
        ('{"client_secret": "s3cr3t"}', "s3cr3t"),
        ("failed for jane.doe+x@example.com", "jane.doe"),
        (pem_block("RSA PRIVATE KEY", "MIIEow"), "MIIEow"),
        (f"echoed {github_token('ghs_')} back", github_token("ghs_")),
        (f"a pasted {github_token('github_pat_')} token", github_token("github_pat_")),
        (f"jira said {atlassian_token()}", atlassian_token()),
        ("{'Authorization': 'token abcdefgh12'}", "abcdefgh12"),
        ("retry with Basic dXNlcjpzZWNyZXQxMjM= later", "dXNlcjpzZWNyZXQxMjM="),
    ],
)
def test_redact_removes_every_secret_shape(text, secret):
    assert secret not in redact(text)


def test_one_line_folds_and_bounds():
    out = one_line("a\nb\t" + "word " * 500, 100)
    assert "\n" not in out and len(out) == 100 and out.endswith("…")
    assert one_line(None) == "" and one_line("") == ""


def test_one_line_writes_control_characters_as_escapes():
    # a NUL or a lone surrogate cannot be stored in a Postgres text column; an ESC would drive a terminal
    assert one_line("bad\x00value\x1b[31m red\x7f \ud800!") == "bad\\u0000value\\u001b[31m red\\u007f \\ud800!"
    assert one_line("tab\tand\nnewline fold") == "tab and newline fold"


def test_resolved_secrets_are_redacted_wherever_they_appear(monkeypatch):
    monkeypatch.setenv("NEXUS_TEST_CANARY", "canary-Zq7 plain words")
    value = resolve("env:NEXUS_TEST_CANARY")
    assert value.get_secret_value() == "canary-Zq7 plain words"
    assert "canary-Zq7" not in describe_exception(RuntimeError("leaked canary-Zq7 plain words here"))


@pytest.mark.parametrize("reference", ["glpat-abcdef0123456789", "env:lower", "env:", "file:relative/path", "ENV:X"])
def test_values_and_malformed_references_are_refused(reference):
    with pytest.raises(SecretReferenceError) as info:
        check_reference(reference)
    assert reference not in str(info.value) or reference.startswith(("env:", "file:"))


def test_unresolvable_references_name_the_reference(tmp_path, monkeypatch):
    monkeypatch.delenv("NEXUS_TEST_UNSET", raising=False)
    with pytest.raises(SecretReferenceError, match="env:NEXUS_TEST_UNSET names an unset"):
        resolve("env:NEXUS_TEST_UNSET")
    with pytest.raises(SecretReferenceError, match="cannot be read"):
        resolve(f"file:{tmp_path}/missing")
    (tmp_path / "short").write_text("abc")
    with pytest.raises(SecretReferenceError, match="shorter than"):
        resolve(f"file:{tmp_path}/short")
    (tmp_path / "key").write_text("a-long-enough-secret\n")
    assert resolve(f"file:{tmp_path}/key").get_secret_value() == "a-long-enough-secret"


@pytest.mark.parametrize(
    "text",
    [
        "writeback run_id=8f14e45f-ceea-467f-a0e6-0123456789ab batch_id=3a7bd3e2360a3d29eea436fcfb7e44c735d117c4",
        "Error: /work/nexus/configs/jobs/month_end_arr_reconciliation_quarterly.yaml: invalid job config",
        "registration gh-rl-secondary-403-retry-after@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d",
        "GitHubCredentialsRefused: installation 7 of GitHub App 3 was refused (HTTP 404)",
        "Basic authentication failed for the integration user; the access token expired",
    ],
)
def test_identifiers_paths_keys_and_prose_stay_readable(text):
    assert redact(text) == text
    assert not looks_like_secret(text)


def test_a_composition_failure_keeps_its_first_word():
    from nexus_pipelines.connectors.github.adapter import GitHubCredentialsRefused

    exc = GitHubCredentialsRefused("installation 7 of GitHub App 3 was refused")
    assert describe_exception(exc) == "GitHubCredentialsRefused: installation 7 of GitHub App 3 was refused"


def test_a_resolved_secret_is_redacted_in_its_base64_and_url_encoded_forms(monkeypatch):
    secret = "Zq7/canary+value=with&odd chars"
    monkeypatch.setenv("NEXUS_TEST_ENCODED_CANARY", secret)
    resolve("env:NEXUS_TEST_ENCODED_CANARY")
    for form in (base64.b64encode(secret.encode()).decode(), base64.urlsafe_b64encode(secret.encode()).decode(),
                 quote(secret, safe=""), quote_plus(secret)):
        assert redact(f"sent {form} upstream") == "sent [redacted] upstream", form


def test_a_composed_basic_pair_is_redacted_though_neither_half_is_printed():
    pair = basic_credentials("bot@example.com", "jira-api-token-Zq7w")
    assert base64.b64decode(pair) == b"bot@example.com:jira-api-token-Zq7w"
    assert redact(f"echo {pair}") == "echo [redacted]"


def test_literal_secrets_in_configs_are_the_shapes_redaction_removes():
    for secret in (gitlab_token("abcdefghij0123456789"), github_token("ghp_"), atlassian_token(),
                   "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiIxIn0.c2lnbmF0dXJl", pem_block("PRIVATE KEY", "MIIEv"),
                   "https://bot:hunter2pass@gitlab.example.com"):
        assert looks_like_secret(secret) and redact(secret) != secret, secret[:8]
    assert not looks_like_secret("1a11d016-8984-4c3e-b9ab-142dd06acb1b")  # a Jira site's cloud id
