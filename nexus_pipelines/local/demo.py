"""`make demo`: the local stack, then the month_end_arr writeback end to end.

1. bring up the embedded stack (Postgres control plane, BigQuery emulator, DAGSTER_HOME,
   the provider sandbox);
2. take the sandbox's ports and serve its simulators in this process (the demo reads
   their state), seed the emulator with a fresh load of Month End ARR rows, some with a
   negative ARR that the simulated CRM's validation rule rejects per record;
3. the NexusCRM simulator answers over real HTTP on loopback (local mode allows http);
4. run `month_end_arr` through its asset graph, then run it again unchanged;
5. print each run's ledger status, counts and the upsert calls it made;
6. run the GitLab, GitHub and Jira issue intake and close-back (`demo_connectors.py`);
7. hand the ports back to the stack's sandbox process, so `make dev` finds it running.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from nexus_pipelines.local.sandbox import REJECT_EVERY, SOURCE_DATASET, SOURCE_ROWS, Sandbox, environment, seed_source
from nexus_pipelines.local.stack import LocalStack
from nexus_pipelines.settings import load_settings



def run_demo(echo: Callable[[str], None]) -> int:
    from nexus_pipelines.control.migrations import MigrationError
    from nexus_pipelines.local.postgres import StackError

    started = time.monotonic()
    settings = load_settings()
    try:
        stack = LocalStack(settings)
        info = stack.up()
    except (StackError, MigrationError) as exc:
        echo(f"error: the local stack did not come up: {exc}")
        return 1
    echo("local stack:")
    for line in info.lines():
        echo("  " + line)
    echo(f"stack ready in {time.monotonic() - started:.1f}s")
    os.environ.update({"NEXUS_PG_DSN": info.pg_dsn, "NEXUS_BQ_EMULATOR_URL": info.bq_emulator_url,
                       "NEXUS_BQ_PROJECT": settings.bq_project, **environment(settings.local_dir, stack.sandbox.ports)})
    from nexus_pipelines.local.demo_connectors import run_connector_demo

    stack.sandbox.stop()  # the demo serves the same simulators itself: it reads their state
    sandbox = Sandbox(settings.local_dir, stack.sandbox.ports)
    try:
        urls = sandbox.serve()
    except RuntimeError as exc:
        echo(f"error: {exc}; stop whatever uses the simulator ports (a `make dev` of another checkout?)")
        return 1
    handed_back = False
    try:
        echo("simulators on " + ", ".join(urls) + f" (tracker data in {settings.local_dir / 'simulators'})")
        writeback = _writeback_demo(echo, info, settings.bq_project, sandbox.crm)
        echo("")
        intake = run_connector_demo(echo, dsn=info.pg_dsn, trackers=sandbox.trackers, instance=_instance(info))
    finally:
        sandbox.stop()
        handed_back = _hand_back(stack, settings.bq_project, info.bq_emulator_url, echo)
    return (writeback or intake) if handed_back else 1


def _hand_back(stack: LocalStack, bq_project: str, emulator_url: str, echo: Callable[[str], None]) -> bool:
    """Give the simulator ports back to the stack's sandbox process, so `make dev` finds it running."""
    from nexus_pipelines.local.postgres import StackError

    try:
        stack.sandbox.start(bq_project=bq_project, emulator_url=emulator_url)
    except StackError as exc:
        echo(f"error: {exc}")
        return False
    return True


def _writeback_demo(echo: Callable[[str], None], info, bq_project: str, state) -> int:
    from nexus_pipelines.writeback.execute import default_resources, run_in_process
    from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper
    from nexus_pipelines.writeback.registry import get_job
    from nexus_pipelines.writeback.report import records_command

    seed_source(bq_project, info.bq_emulator_url)
    echo(f"seeded {SOURCE_ROWS} Month End ARR rows in {bq_project}.{SOURCE_DATASET} "
         f"({SOURCE_ROWS // REJECT_EVERY} with a negative ARR the CRM rejects)")
    obj = MonthEndArrMapper.TARGET_OBJECT
    resources = default_resources(info.pg_dsn)
    instance = _instance(info)
    outcomes = []
    for label in ("first run", "rerun"):
        before = state.calls().get("upsert", 0)
        t0 = time.monotonic()
        outcome = run_in_process("month_end_arr", str(get_job("month_end_arr").local_config_path),
                                 resources=resources, instance=instance,
                                 log_level="CRITICAL")  # the summary below reports each run
        upserts = state.calls().get("upsert", 0) - before
        outcomes.append((label, outcome, upserts, time.monotonic() - t0))
    echo("")
    echo("month_end_arr writeback summary")
    for label, o, upserts, seconds in outcomes:
        c = o.counts
        echo(f"  {label:<9} status={o.status:<22} selected={c.get('selected', 0):<5} "
             f"unchanged={c.get('unchanged', 0):<5} succeeded={c.get('succeeded', 0):<5} "
             f"failed={c.get('retryable_failed', 0) + c.get('permanently_failed', 0):<3} "
             f"upsert_calls={upserts:<3} ({seconds:.1f}s, exit code {o.exit_code})")
        if o.rejected:
            rejected = ", ".join(f"{external_id} ({code})" for external_id, code in o.rejected[:3])
            echo(f"            rejected: {rejected}, ... ({c.get('permanently_failed', 0)} permanent in all)")
        elif o.status == "failed" and o.error:
            echo(f"            error: {o.error}")
    echo(f"  CRM now holds {len(state.records(obj))} {obj} records")
    echo(f"  every rejected row: . {info.env_file} && {records_command('month_end_arr', 'permanent_failed')}")
    echo("  the runs (job writeback_month_end_arr_job): `make dev`, then http://127.0.0.1:3000/runs")
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
