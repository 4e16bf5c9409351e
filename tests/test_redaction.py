"""The one redaction rule and credential references."""

from __future__ import annotations

import pytest

from nexus_pipelines.credentials import SecretReferenceError, check_reference, resolve
from nexus_pipelines.redaction import describe_exception, one_line, redact
from tests.tokens import gitlab_token, pem_block


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
        ("opaque 0123456789abcdef0123456789abcdef01 in text", "0123456789abcdef0123456789abcdef01"),
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


def test_a_random_uuid_names_a_container_but_an_opaque_token_is_still_a_secret():
    from nexus_pipelines.redaction import looks_like_secret

    assert not looks_like_secret("1a11d016-8984-4c3e-b9ab-142dd06acb1b")  # a Jira site's cloud id
    assert looks_like_secret("ATATT3xFfGF0a81bQ9zK2mW7pLq4Rt6Yv8Nc1Dd3Ee5Gg7Hh9Jj0Kk2")
    assert looks_like_secret("1a11d016-8984-4c3e-b9ab-142dd06acb1b-but-longer9x")  # not a UUID at all
