from __future__ import annotations

import json
from datetime import timedelta

from click.testing import CliRunner

from nexus_pipelines.cli import main
from nexus_pipelines.workqueue import claims
from nexus_pipelines.workqueue.receipts import enqueue_work_items

from .conftest import items


def run(dsn, *args):
    result = CliRunner().invoke(main, ["queue", *args], env={"NEXUS_PG_DSN": dsn}, catch_exceptions=False)
    return result


def test_queue_commands_end_to_end(control_conn, control_dsn, reg):
    enqueue_work_items(control_conn, items(3, "cli.test"), registration_id=reg, revision=1)
    out = run(control_dsn, "activate", reg, "1", "--route", "bulk=1")
    assert out.exit_code == 0 and "is active" in out.output
    assert run(control_dsn, "activate", reg, "2").exit_code != 0  # revision 1 is active: refused
    (item,) = claims.claim_batch(control_conn, owner="w", limit=1, lease_ttl=timedelta(seconds=30), registration_ids=[reg])
    claims.fail(control_conn, item, "Rejected", "no")
    listing = run(control_dsn, "dlq", "list", "--registration", reg)
    assert str(item.work_id) in listing.output and "Rejected" in listing.output
    stats = run(control_dsn, "stats", "--json")
    health = json.loads(stats.output)
    assert health["dead"] >= 1 and "depth_by_queue_class" in health
    replayed = run(control_dsn, "replay", str(item.work_id))
    assert replayed.exit_code == 0 and "pending again" in replayed.output
    refused = run(control_dsn, "replay", str(item.work_id))
    assert refused.exit_code != 0 and "replay refused" in refused.output
    drained = run(control_dsn, "drain", "--registration", reg, "--time-budget", "5")
    assert drained.exit_code == 0 and json.loads(drained.output.splitlines()[-1])["claimed"] == 0  # nothing registered
    quiesced = run(control_dsn, "quiesce", reg, "1")
    assert quiesced.exit_code == 0 and "drained" in quiesced.output
    assert run(control_dsn, "activate", reg, "2").exit_code == 0
