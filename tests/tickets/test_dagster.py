"""Dagster sees triage: the tickets observations carry the untriaged count, and the triage
age check warns while a finding waits longer than the configured age, then passes once
the commander has triaged."""

from __future__ import annotations

import time

from dagster import AssetCheckSeverity, AssetSelection, DagsterInstance, Definitions, define_asset_job

from nexus_pipelines.tickets.assets import TRIAGE_AGE_CHECK, tickets_asset_key, tickets_asset_specs, triage_age_check
from nexus_pipelines.tickets.jobs import tickets_observe_job
from nexus_pipelines.control.resources import ControlPlaneResource
from nexus_pipelines.local.worlds.gitlab import PROJECT_ID, GitLabWorld
from nexus_pipelines.local.worlds.plant import Plant
from nexus_pipelines.local.worlds.plant import member
from tests.tickets.support import ingest, set_priority, triage


def _check_results(control_dsn, rid, max_age_hours):
    check = triage_age_check([rid], max_age_hours)
    defs = Definitions(assets=tickets_asset_specs([rid]), asset_checks=[check],
                       jobs=[define_asset_job("check", selection=AssetSelection.checks(check))],
                       resources={"control_plane": ControlPlaneResource(dsn=control_dsn)})
    result = defs.resolve_job_def("check").execute_in_process(instance=DagsterInstance.ephemeral())
    assert result.success
    return [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]


def _observed_untriaged(control_dsn, rid) -> int:
    observed = tickets_observe_job.execute_in_process(
        instance=DagsterInstance.ephemeral(), resources={"control_plane": ControlPlaneResource(dsn=control_dsn)})
    (observation,) = [e.event_specific_data.asset_observation for e in observed.all_events
                      if e.event_type_value == "ASSET_OBSERVATION" and
                      e.event_specific_data.asset_observation.asset_key == tickets_asset_key(rid)]
    return observation.metadata["untriaged"].value


def test_the_triage_check_warns_while_a_finding_is_older_than_the_age_and_the_count_is_observed(pool, control_dsn):
    registration, ids = ingest(Plant(GitLabWorld(project_id=PROJECT_ID + 3000), pool), "dagster-triage", 2)
    rid = registration.registration_id
    (fresh,) = _check_results(control_dsn, rid, max_age_hours=1)
    assert fresh.passed and fresh.metadata["unresolved_findings"].value == 2
    assert _observed_untriaged(control_dsn, rid) == 2
    time.sleep(2.1)
    (late,) = _check_results(control_dsn, rid, max_age_hours=1 / 3600)  # one second
    assert (late.passed, late.severity, late.asset_key, late.check_name) == (
        False, AssetCheckSeverity.WARN, tickets_asset_key(rid), TRIAGE_AGE_CHECK)
    assert late.metadata["oldest_waiting_s"].value >= 2 and "2 Attention findings wait" in late.description
    with pool.connection() as conn:
        commander, _ = member(conn, "acme/dagster-triage", "commander")
        for ticket_id in ids:
            set_priority(conn, commander, ticket_id)
            triage(conn, commander, ticket_id)
    (cleared,) = _check_results(control_dsn, rid, max_age_hours=1 / 3600)
    assert cleared.passed and cleared.metadata["unresolved_findings"].value == 0
    assert _observed_untriaged(control_dsn, rid) == 0


def test_no_registration_means_no_triage_check():
    assert triage_age_check([], 24) is None
