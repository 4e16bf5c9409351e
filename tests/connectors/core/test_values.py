"""The seam's values refuse every combination the connector contract forbids."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from nexus_pipelines.connectors.core.values import (
    RETRYABLE_REASONS,
    TERMINAL_REASONS,
    AmbiguousWrite,
    CloseExternalIssue,
    CloseFailure,
    ConnectorAttempt,
    ExternalIssue,
    ExternalIssuePage,
    FetchFailure,
    FetchIssuePage,
    first_error,
    source_version_digest,
)

REASONS = sorted(RETRYABLE_REASONS | TERMINAL_REASONS)


def issue(**changes) -> ExternalIssue:
    data = dict(connector_kind="gitlab", external_ref="gitlab:1:2", title="t", description="", source_labels=(),
                reporter_ref="gitlab-user:1", reporter_display_name="R", external_state="open",
                external_updated_at=datetime(2026, 1, 1, tzinfo=UTC), display_url="https://x.test/1")
    return ExternalIssue(**{**data, **changes})


@pytest.mark.parametrize("reason, retry_class", list(itertools.product(REASONS, ["retryable", "terminal"])))
def test_only_the_contract_reason_class_pairs_validate(reason, retry_class):
    allowed = reason in (RETRYABLE_REASONS if retry_class == "retryable" else TERMINAL_REASONS)
    for build in (lambda: FetchFailure(retry_class=retry_class, reason=reason),
                  lambda: CloseFailure(retry_class=retry_class, reason=reason, write_disposition="not_written")):
        if allowed:
            build()
        else:
            with pytest.raises(ValidationError):
                build()


def test_the_reason_sets_are_exactly_the_contracts():
    assert RETRYABLE_REASONS == {"timeout", "transport_connect", "transport_read", "transport_protocol", "throttled",
                                 "provider_5xx"}
    assert TERMINAL_REASONS == {"authentication", "authorization", "ordinary_4xx", "invalid_payload",
                                "unsupported_item", "contract_violation"}


def test_fetch_failures_carry_no_write_disposition_and_close_failures_no_ambiguity():
    with pytest.raises(ValidationError):
        FetchFailure(retry_class="retryable", reason="timeout", write_disposition="not_written")
    with pytest.raises(ValidationError):
        CloseFailure(retry_class="retryable", reason="timeout", write_disposition="reconciliation_inconclusive")
    with pytest.raises(ValidationError):
        AmbiguousWrite(reason="timeout")
    with pytest.raises(ValidationError):
        FetchFailure(retry_class="retryable", reason="timeout", retry_after_seconds=3)  # only throttling waits
    assert AmbiguousWrite().write_disposition == "reconciliation_inconclusive"


def test_attempts_and_pages_are_bounded():
    with pytest.raises(ValidationError):
        ConnectorAttempt(attempt_number=5, deadline_remaining_milliseconds=10)
    with pytest.raises(ValidationError):
        ConnectorAttempt(attempt_number=1, deadline_remaining_milliseconds=10_001)
    with pytest.raises(ValidationError):
        FetchIssuePage(cursor=None, page_size=101)
    with pytest.raises(ValidationError):
        FetchIssuePage(cursor="has space", page_size=1)
    with pytest.raises(ValidationError):
        ExternalIssuePage(issues=(), next_cursor="x" * 1025, exhausted=True)


@pytest.mark.parametrize("changes", [
    {"external_ref": "gitlab:1"}, {"external_ref": "github:1:2"}, {"title": ""}, {"title": "x" * 1025},
    {"external_state": "opened"}, {"external_updated_at": datetime(2026, 1, 1)}, {"description": "nul\x00byte"},
    {"display_url": "javascript:alert(1)"}, {"source_labels": tuple(f"l{i}" for i in range(101))},
])
def test_malformed_issues_fail_closed(changes):
    with pytest.raises(ValidationError):
        issue(**changes)


def test_the_digest_is_deterministic_over_the_normalized_value():
    assert source_version_digest(issue()) == source_version_digest(issue())
    assert source_version_digest(issue()) != source_version_digest(issue(title="other"))
    assert source_version_digest(issue()).startswith("sha256:")


def test_the_digest_of_an_issue_stays_what_earlier_releases_stored():
    # custody compares digests across releases: a changed serialization would re-observe every issue
    stored = issue(title='Crème brûlée "quoted"', description="line one\nline\ttwo", source_labels=("bug", "ünïcode"),
                   external_updated_at=datetime(2026, 1, 1, 10, 30, tzinfo=timezone(timedelta(hours=2))))
    assert source_version_digest(stored) == "sha256:c444509964a8a2b35de91247193984b5c2a82d1baa73899d10221541f97d2745"


@pytest.mark.parametrize("text", ['quote " backslash \\ slash / </script>', "line\r\nbreak\ttab", "Crème ✓ 問題 😀",
                                  "line\u2028para\u2029 nbsp\u00a0 zwj\u200d rtl\u200f bom\ufeff", "e\u0301 combining"])
def test_the_canonical_form_is_the_sorted_compact_json_of_the_issue_with_non_ascii_kept(text):
    """What the digest is taken over, however it is produced: the issue's JSON with its keys
    sorted, no spaces, and non-ASCII characters as they are."""
    import json

    from nexus_pipelines.connectors.core.values import canonical_form

    value = issue(title=text, description=text, source_labels=(text, "b"), reporter_display_name=text,
                  external_updated_at=datetime(2026, 1, 1, 10, 30, 15, 250000, tzinfo=timezone(timedelta(hours=-5))))
    expected = json.dumps(value.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_form(value) == expected


@pytest.mark.parametrize("changes", [{"title": "bell\x07"}, {"description": "nul\x00"},
                                     {"source_labels": ("ok", "del\x7f")}, {"reporter_display_name": "esc\x1b"}])
def test_a_control_character_in_an_issue_text_is_a_clear_error(changes):
    with pytest.raises(ValidationError) as refused:
        issue(**changes)
    assert "control characters are not allowed" in first_error(refused.value)


def test_building_an_issue_calls_no_python_validator_per_text():
    """The text rules run in the validator core: a page of 100 issues does not call back into
    Python for each of their titles, descriptions, labels and reporters."""
    import sys

    from nexus_pipelines.connectors.core import values

    called = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename == values.__file__:
            called.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        issue(title="title", description="body\n", source_labels=("a", "b", "c"), reporter_display_name="R")
    finally:
        sys.setprofile(None)
    assert sorted(called) == ["_ref_names_the_kind", "_utc"]  # one per issue each, whatever its texts


def test_text_keeps_its_line_breaks_and_tabs():
    assert issue(description="line one\r\nline\ttwo").description == "line one\r\nline\ttwo"


def test_a_close_command_carries_its_own_marker_in_the_comment():
    cid = "close-" + "a" * 32
    with pytest.raises(ValidationError):
        CloseExternalIssue(external_ref="gitlab:1:2", command_id=cid, marker="[nexus:close:" + "a" * 32 + "]",
                           comment="no marker here")
    with pytest.raises(ValidationError):
        CloseExternalIssue(external_ref="gitlab:1:2", command_id=cid, marker="[nexus:close:" + "b" * 32 + "]",
                           comment="[nexus:close:" + "b" * 32 + "]")
