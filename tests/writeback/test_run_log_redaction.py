"""Run logs and the ledger never carry tokens, secrets, payloads or customer fields
(docs/design/writeback-run.md, "Logs and secrets")."""

from __future__ import annotations

import logging
import uuid

import pytest

from nexus_pipelines.local.simulators.nexuscrm import Fault
from nexus_pipelines.writeback.logs import render_event

from .support import context, make_config, new_state, seed_source


@pytest.fixture(scope="module")
def source(bq_client):
    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, 40, negative_every=20)
    return dataset


def test_logs_never_carry_tokens_secrets_payloads_or_customer_fields(bq_client, make_runner, source, caplog,
                                                                      control_conn):
    state = new_state()
    state.faults.push(Fault.expire_token())
    caplog.set_level(logging.DEBUG)
    runner = make_runner(make_config(source, batch_size=10), state, job_name="redact")
    result = runner.run(context("redact-1"))
    assert result.succeeded == 38
    text = caplog.text
    assert "batch_committed" in text and "redact-1" in text
    for forbidden in (state.client_secret, state.client_id, "Bearer 00Dsim", "00Dsim!", "001000000000001",
                      "Month_End_ARR_Key__c\": \"", "ARR_Amount__c", "Cloud", "12.75"):
        assert forbidden not in text, forbidden
    # nor in the ledger
    dump = str(control_conn.execute("SELECT * FROM outbound_runs WHERE job_name = 'redact'").fetchall())
    dump += str(control_conn.execute("SELECT error_message FROM outbound_record_attempts WHERE job_name = 'redact'").fetchall())
    assert state.client_secret not in dump and "Bearer" not in dump


def test_render_event_refuses_secret_keys_and_sanitizes_values():
    with pytest.raises(ValueError):
        render_event("x", authorization="Bearer abc")
    with pytest.raises(ValueError):
        render_event("x", payload={"a": 1})
    line = render_event("x", error="failed with Bearer abc.def for jane@example.com\n" + "y" * 1000)
    assert "abc.def" not in line and "jane@example.com" not in line and len(line) < 400 and "\\n" not in line
