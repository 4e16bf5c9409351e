"""The CRM preflight runs while the warehouse materializes the candidate table; a failed
preflight still fails the run with its own error, selects nothing and leaves no table."""

from __future__ import annotations

import threading

import pytest
from google.api_core.exceptions import NotFound

from nexus_pipelines.integrations.nexuscrm import NexusCrmClient
from nexus_pipelines.local.simulators.nexuscrm import NexusCrmState
from nexus_pipelines.writeback import runner as runner_module

from .support import OBJ, context, deploy, job, make_config, seed

MET_WITHIN_S = 30  # far past any real overlap; only a run that does them one after the other waits it out


def test_the_preflight_runs_while_the_candidate_table_is_materialized(bq_client, make_runner, sim_state, monkeypatch):
    authenticating, materializing = threading.Event(), threading.Event()
    met = {}
    real_authenticate, real_materialize = NexusCrmClient.authenticate, runner_module.materialize_candidates

    def authenticate(self, *args, **kwargs):
        authenticating.set()
        met["preflight saw the materialization"] = materializing.wait(MET_WITHIN_S)
        return real_authenticate(self, *args, **kwargs)

    def materialize(*args, **kwargs):
        materializing.set()
        met["materialization saw the preflight"] = authenticating.wait(MET_WITHIN_S)
        return real_materialize(*args, **kwargs)

    monkeypatch.setattr(NexusCrmClient, "authenticate", authenticate)
    monkeypatch.setattr(runner_module, "materialize_candidates", materialize)
    result = make_runner(make_config(seed(bq_client)), sim_state, job_name=job()).run(context())
    assert result.status == "succeeded", result.error_message
    assert met == {"preflight saw the materialization": True, "materialization saw the preflight": True}


def test_a_failed_preflight_fails_the_run_selects_nothing_and_leaves_no_candidate_table(bq_client, make_runner):
    state = NexusCrmState()
    deploy(state)
    state.alter_field(OBJ, "Product_Line__c", drop=True)
    runner = make_runner(make_config(seed(bq_client)), state, job_name=job())
    result = runner.run(context())
    assert result.status == "failed" and "owned field Product_Line__c does not exist" in result.error_message
    assert result.selected == 0 and state.calls().get("upsert", 0) == 0
    with pytest.raises(NotFound):
        bq_client.get_table(runner.table_id)
