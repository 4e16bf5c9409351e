"""`make demo`: the local stack, then the month_end_arr writeback end to end.

1. bring up the embedded stack (Postgres control plane, BigQuery emulator, DAGSTER_HOME);
2. seed the emulator with a few thousand Month End ARR rows, some with a negative ARR
   that the simulated CRM's validation rule rejects per record;
3. serve the NexusCRM simulator over real HTTP on loopback (local mode allows http);
4. run `month_end_arr` through its asset graph, then run it again unchanged;
5. print each run's ledger status, counts and the upsert calls it made;
6. run the GitLab, GitHub and Jira issue intake and close-back (`demo_connectors.py`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from nexus_pipelines.local.stack import LocalStack
from nexus_pipelines.settings import PROJECT_ROOT, load_settings

DEMO_ROWS = 3000
REJECT_EVERY = 250  # every 250th row has a negative ARR: 12 per-record rejections
SOURCE_DATASET = "finance_marts"
LOCAL_CONFIG = PROJECT_ROOT / "configs" / "jobs" / "month_end_arr.local.yaml"


def run_demo(echo: Callable[[str], None]) -> int:
    from nexus_pipelines.control.migrations import MigrationError
    from nexus_pipelines.local.postgres import StackError

    started = time.monotonic()
    settings = load_settings()
    try:
        info = LocalStack(settings).up()
    except (StackError, MigrationError) as exc:
        echo(f"error: the local stack did not come up: {exc}")
        return 1
    echo("local stack:")
    for line in info.lines():
        echo("  " + line)
    echo(f"stack ready in {time.monotonic() - started:.1f}s")
    os.environ.update({"NEXUS_PG_DSN": info.pg_dsn, "NEXUS_BQ_EMULATOR_URL": info.bq_emulator_url,
                       "NEXUS_BQ_PROJECT": settings.bq_project})
    writeback = _writeback_demo(echo, info, settings.bq_project)
    echo("")
    from nexus_pipelines.local.demo_connectors import run_connector_demo

    intake = run_connector_demo(echo, dsn=info.pg_dsn, local_dir=settings.local_dir, instance=_instance(info))
    return writeback or intake


def _writeback_demo(echo: Callable[[str], None], info, bq_project: str) -> int:
    from nexus_pipelines.integrations.bigquery import make_bigquery_client
    from nexus_pipelines.local.simulators.nexuscrm import NexusCrmState, build_nexuscrm_app, serve_in_thread
    from nexus_pipelines.writeback.execute import default_resources, run_in_process
    from nexus_pipelines.writeback.jobs.month_end_arr import crm_metadata
    from nexus_pipelines.writeback.jobs.month_end_arr.demo_data import seed_source
    from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper

    client = make_bigquery_client(bq_project, "US", info.bq_emulator_url)
    seed_source(client, SOURCE_DATASET, DEMO_ROWS, negative_every=REJECT_EVERY,
                load_run_id=f"demo-load-{int(time.time())}")
    echo(f"seeded {DEMO_ROWS} Month End ARR rows in {bq_project}.{SOURCE_DATASET} "
         f"({DEMO_ROWS // REJECT_EVERY} with a negative ARR the CRM rejects)")

    state = NexusCrmState()
    crm_metadata.define_object(state)
    state.add_validation_rule(MonthEndArrMapper.TARGET_OBJECT, crm_metadata.reject_negative_arr)
    url, stop = serve_in_thread(build_nexuscrm_app(state))
    # Simulator credentials: demo values, not secrets; read through the named env vars.
    os.environ.update({"NEXUSCRM_BASE_URL": url, "NEXUSCRM_CLIENT_ID": state.client_id,
                       "NEXUSCRM_CLIENT_SECRET": state.client_secret})
    echo(f"NexusCRM simulator on {url}")
    resources = default_resources(info.pg_dsn)
    instance = _instance(info)
    outcomes = []
    try:
        for label in ("first run", "rerun"):
            before = state.calls().get("upsert", 0)
            t0 = time.monotonic()
            outcome = run_in_process("month_end_arr", str(LOCAL_CONFIG), resources=resources, instance=instance,
                                     log_level="CRITICAL")  # the summary below reports each run
            upserts = state.calls().get("upsert", 0) - before
            outcomes.append((label, outcome, upserts, time.monotonic() - t0))
            echo(f"{label}: {outcome.summary()}")
    finally:
        stop()
    echo("")
    echo("month_end_arr writeback summary")
    for label, o, upserts, seconds in outcomes:
        c = o.counts
        echo(f"  {label:<9} status={o.status:<22} selected={c.get('selected', 0):<5} "
             f"unchanged={c.get('unchanged', 0):<5} succeeded={c.get('succeeded', 0):<5} "
             f"failed={c.get('retryable_failed', 0) + c.get('permanently_failed', 0):<3} "
             f"upsert_calls={upserts:<3} ({seconds:.1f}s, exit code {o.exit_code})")
        if o.error:
            echo(f"            error: {o.error}")
    echo(f"  CRM now holds {len(state.records(MonthEndArrMapper.TARGET_OBJECT))} {MonthEndArrMapper.TARGET_OBJECT} records")
    echo("  ledger: outbound_runs / outbound_records / outbound_record_attempts in the control plane "
         "(NEXUS_PG_DSN above)")
    ok = all(o.status in ("succeeded", "completed_with_errors") for _, o, _, _ in outcomes)
    return 0 if ok else 1


def _instance(info):
    """The local DAGSTER_HOME instance, so the demo runs show in `make dev`; an ephemeral
    one if that instance cannot be opened."""
    from dagster import DagsterInstance

    try:
        os.environ["DAGSTER_HOME"] = str(info.dagster_home)
        return DagsterInstance.get()
    except Exception:
        return DagsterInstance.ephemeral()
