"""The Postgres ledger: state transitions, unchanged skipping, attempt counts, fenced
batch commits, retention, and the documented table/column shape."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from nexus_pipelines.control.leases import LeaseLost
from nexus_pipelines.writeback.ledger import AttemptOutcome, BatchCounts, Ledger, RecordState, lease_name, prune_attempts
from nexus_pipelines.writeback.mapping import MappedRecord
from nexus_pipelines.writeback.runner import decide

TTL = timedelta(minutes=5)
NOW = datetime(2026, 11, 1, tzinfo=UTC)


def outcome(eid, h="h1", status="succeeded", attempt=1, crm="a0M1", code=None, delay=None):
    return AttemptOutcome(eid, h, "v1", attempt, status, crm if status == "succeeded" else None, 200, code,
                          "msg" if code else None, 12, delay)


@pytest.fixture
def ledger(control_conn, request):
    job = f"job_{request.node.name[:40]}"
    return Ledger(control_conn, job, "Month_End_ARR__c")


def test_the_ledger_tables_have_their_documented_columns(control_conn):
    def cols(table):
        return [r[0] for r in control_conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
            (table,))]
    assert cols("outbound_job_leases")[:5] == ["job_name", "owner_run_id", "acquired_at", "heartbeat_at", "expires_at"]
    assert cols("outbound_runs")[:13] == [
        "job_name", "run_id", "source_run_id", "source_cutoff_at", "status", "selected_rows", "unchanged_rows",
        "succeeded_rows", "retryable_failed_rows", "permanently_failed_rows", "started_at", "ended_at", "error_message"]
    assert cols("outbound_records") == [
        "job_name", "target_object", "external_id", "payload_hash", "source_version", "crm_record_id", "status",
        "attempt_count", "last_attempt_run_id", "last_success_run_id", "next_retry_at", "error_code",
        "error_message", "updated_at"]
    assert cols("outbound_record_attempts") == [
        "attempted_at", "job_name", "run_id", "batch_id", "external_id", "payload_hash", "attempt_number", "status",
        "crm_record_id", "http_status", "error_code", "error_message", "duration_ms",
        "recorded_xid"]  # the transaction that recorded the attempt: the ledger export's incremental mark


def test_batch_commit_writes_attempts_and_states_in_one_transaction(ledger, control_conn):
    lease = ledger.acquire_lease("r1", TTL)
    ledger.start_run("r1", dry_run=False, options={}, lease_token=lease.token)
    outs = [outcome("a"), outcome("b", status="retryable_failed", code="UNABLE_TO_LOCK_ROW", delay=30.0),
            outcome("c", status="permanent_failed", code="FIELD_CUSTOM_VALIDATION_EXCEPTION")]
    renewed = ledger.commit_batch("r1", "r1:000001", lease, TTL, outs, BatchCounts(1, 1, 1, 1)).lease
    assert renewed.expires_at >= lease.expires_at
    states = ledger.read_states(["a", "b", "c", "zz"])
    assert set(states) == {"a", "b", "c"}
    assert states["a"].status == "succeeded" and states["a"].crm_record_id == "a0M1" and states["a"].next_retry_at is None
    assert states["b"].status == "retryable_failed" and states["b"].next_retry_at is not None
    assert states["c"].status == "permanent_failed" and states["c"].error_code == "FIELD_CUSTOM_VALIDATION_EXCEPTION"
    rows = {r["external_id"]: r for r in ledger.record_rows()}
    assert rows["a"]["last_success_run_id"] == "r1" and rows["b"]["last_success_run_id"] is None
    run = ledger.run_row("r1")
    assert (run["succeeded_rows"], run["retryable_failed_rows"], run["permanently_failed_rows"], run["batches"]) == (1, 1, 1, 1)
    # one row per attempt, never a payload column
    assert control_conn.execute("SELECT count(*) FROM outbound_record_attempts WHERE job_name = %s",
                                (ledger.job_name,)).fetchone()[0] == 3


def test_a_batch_commit_reports_its_statement_time_on_the_database_clock(ledger, control_conn):
    """The time is measured inside the statement: one made slow in the server (a trigger that
    sleeps 0.3 s on the attempts insert) reports at least the sleep."""
    quick = ledger.commit_batch("r1", "b1", None, TTL, [outcome("a")], BatchCounts(1)).db_seconds
    control_conn.execute("CREATE FUNCTION slow_attempts() RETURNS trigger LANGUAGE plpgsql "
                         "AS $$ BEGIN PERFORM pg_sleep(0.3); RETURN NEW; END $$")
    control_conn.execute("CREATE TRIGGER slow_attempts BEFORE INSERT ON outbound_attempt_batches "
                         "FOR EACH ROW EXECUTE FUNCTION slow_attempts()")
    try:
        slow = ledger.commit_batch("r1", "b2", None, TTL, [outcome("b")], BatchCounts(1)).db_seconds
    finally:
        control_conn.execute("DROP TRIGGER slow_attempts ON outbound_attempt_batches")
        control_conn.execute("DROP FUNCTION slow_attempts()")
    assert slow >= 0.3
    assert quick >= 0


def test_success_keeps_last_success_and_crm_id_through_later_failures(ledger):
    ledger.commit_batch("r1", "b1", None, TTL, [outcome("a", crm="a0M9")], BatchCounts(1))
    ledger.commit_batch("r2", "b2", None, TTL, [outcome("a", h="h2", status="retryable_failed", code="TIMEOUT", delay=1)],
                        BatchCounts(retryable_failed=1))
    (row,) = ledger.record_rows()
    assert row["crm_record_id"] == "a0M9" and row["last_success_run_id"] == "r1"
    assert row["last_attempt_run_id"] == "r2" and row["status"] == "retryable_failed"


def test_stale_fencing_token_keeps_evidence_but_not_state(ledger, control_conn):
    lease = ledger.acquire_lease("r1", TTL)
    ledger.start_run("r1", dry_run=False, options={}, lease_token=lease.token)
    control_conn.execute("UPDATE leases SET acquired_at = clock_timestamp() - interval '1 hour', "
                         "expires_at = clock_timestamp() - interval '1 second' WHERE lease_name = %s", (lease.name,))
    thief = ledger.acquire_lease("r2", TTL)
    assert thief is not None and thief.token > lease.token
    with pytest.raises(LeaseLost):
        ledger.commit_batch("r1", "r1:000001", lease, TTL, [outcome("a")], BatchCounts(1))
    assert ledger.read_states(["a"]) == {}
    assert control_conn.execute("SELECT count(*) FROM outbound_record_attempts WHERE batch_id = 'r1:000001' "
                                "AND job_name = %s", (ledger.job_name,)).fetchone() == (1,)


def test_lease_view_and_single_holder(ledger, control_conn):
    first = ledger.acquire_lease("r1", TTL)
    assert first is not None and ledger.acquire_lease("r2", TTL) is None
    row = control_conn.execute("SELECT job_name, owner_run_id FROM outbound_job_leases WHERE job_name = %s",
                               (ledger.job_name,)).fetchone()
    assert row == (ledger.job_name, "r1")
    assert lease_name(ledger.job_name) == f"writeback:{ledger.job_name}"
    assert ledger.release_lease(first) and ledger.acquire_lease("r2", TTL) is not None


def test_skipped_run_row(ledger):
    ledger.record_skipped("r9", dry_run=False, options={}, message="another run holds the lease")
    row = ledger.run_row("r9")
    assert row["status"] == "skipped_already_running" and row["ended_at"] is not None


def test_run_status_is_constrained(ledger):
    ledger.start_run("r1", dry_run=False, options={}, lease_token=None)
    with pytest.raises(psycopg.errors.CheckViolation):
        ledger.finish_run("r1", "partially_ok", selected=0, unchanged=0, succeeded=0, retryable=0, permanent=0,
                          batches=0, crm_calls=0, error_message=None)


def test_attempts_are_append_only_and_pruned_after_90_days(ledger, control_conn):
    ledger.commit_batch("r1", "b1", None, TTL, [outcome("a"), outcome("b")], BatchCounts(2))
    with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
        control_conn.execute("UPDATE outbound_record_attempts SET status = 'succeeded'")
    with pytest.raises(psycopg.errors.RaiseException, match="retention"):
        control_conn.execute("DELETE FROM outbound_record_attempts WHERE job_name = %s", (ledger.job_name,))
    control_conn.execute(
        "INSERT INTO outbound_record_attempts (attempted_at, job_name, run_id, batch_id, external_id, payload_hash, "
        "attempt_number, status) VALUES (clock_timestamp() - interval '91 days', %s, 'old', 'old:1', 'x', 'h', 1, "
        "'succeeded')", (ledger.job_name,))
    assert prune_attempts(control_conn, chunk=1) >= 1
    left = control_conn.execute("SELECT count(*) FROM outbound_record_attempts WHERE job_name = %s",
                                (ledger.job_name,)).fetchone()[0]
    assert left == 2


def rec(h="h1"):
    return MappedRecord("a", "v", {}, h)


def state(status, h="h1", attempts=1, next_retry_at=None):
    return RecordState("a", h, status, attempts, next_retry_at, None, None)


@pytest.mark.parametrize("prior,kwargs,expected", [
    (None, {}, "write"),
    (state("succeeded"), {}, "unchanged"),
    (state("succeeded", h="h0"), {}, "write"),
    (state("succeeded"), {"force": True}, "write"),
    (state("succeeded"), {"skip_unchanged": False}, "write"),
    (state("permanent_failed"), {}, "unchanged"),
    (state("permanent_failed", h="h0"), {}, "write"),
    (state("permanent_failed"), {"force": True}, "write"),
    (state("retryable_failed", next_retry_at=NOW - timedelta(seconds=1)), {}, "write"),
    (state("retryable_failed", next_retry_at=NOW + timedelta(minutes=5)), {}, "deferred"),
    (state("retryable_failed", h="h0", next_retry_at=NOW + timedelta(minutes=5)), {}, "write"),
    (state("retryable_failed", next_retry_at=NOW + timedelta(minutes=5)), {"retry_failed": True}, "write"),
    (state("succeeded", h="h0"), {"retry_failed": True}, "unchanged"),
    (None, {"retry_failed": True}, "unchanged"),
])
def test_state_rules(prior, kwargs, expected):
    options = {"force": False, "retry_failed": False, "skip_unchanged": True, **kwargs}
    assert decide(rec(), prior, now=NOW, **options) == expected


def test_a_rewrite_of_a_batch_of_records_stays_on_their_pages(ledger, control_conn):
    """HOT updates (migration 0022): rewriting a batch's records adds no index entries."""
    def hot_updates() -> int:
        control_conn.execute("SELECT pg_stat_force_next_flush()")
        return control_conn.execute("SELECT n_tup_hot_upd FROM pg_stat_user_tables "
                                    "WHERE relname = 'outbound_records'").fetchone()[0]

    ids = [f"hot-{i:03d}" for i in range(200)]
    ledger.commit_batch("r1", "b1", None, TTL, [outcome(x, h="h1") for x in ids], BatchCounts(200))
    before = hot_updates()
    ledger.commit_batch("r2", "b2", None, TTL, [outcome(x, h="h2") for x in ids], BatchCounts(200))
    assert hot_updates() - before >= 190


def test_a_batch_commit_stamps_its_attempts_and_records_with_one_time(ledger):
    """One time per batch: its attempts are one event, and a time per row widened the
    attempted_at BRIN range on every insert (a WAL record per row)."""
    ids = [f"one-{i:03d}" for i in range(50)]
    outs = [outcome(x) for x in ids[:-1]] + [outcome(ids[-1], status="retryable_failed", code="TIMEOUT", delay=30)]
    ledger.commit_batch("r1", "b1", None, TTL, outs, BatchCounts(49, 1))
    attempted = {r[0] for r in ledger.conn.execute(
        "SELECT attempted_at FROM outbound_record_attempts WHERE job_name = %s", (ledger.job_name,))}
    rows = ledger.record_rows(ids)
    assert len(attempted) == 1 and {r["updated_at"] for r in rows} == attempted
    retry = next(r for r in rows if r["external_id"] == ids[-1])
    assert retry["next_retry_at"] == retry["updated_at"] + timedelta(seconds=30)


def _wal_writes(conn, start, relations):
    """(record type, relation) of each WAL block reference since `start` to one of `relations`."""
    files = {conn.execute("SELECT pg_relation_filenode(%s)", (r,)).fetchone()[0]: r for r in relations}
    rows = conn.execute("SELECT resource_manager, record_type, relfilenode FROM pg_get_wal_block_info(%s, "
                        "pg_current_wal_flush_lsn())", (start,)).fetchall()
    return [(f"{rm}/{kind}", files[node]) for rm, kind, node in rows if node in files]


def test_a_batch_commit_inserts_new_records_plainly_and_its_attempts_as_one_batch_row(ledger, control_conn):
    """A record new to the ledger is a plain insert (no speculative insert to confirm), a
    known one is updated in place, and the batch's attempts are one row with one btree
    entry (its transaction id, for the export), not a row and an entry per attempt
    (migration 0029); the run index is a block range."""
    control_conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    control_conn.execute("SET synchronous_commit = on")  # the suite's server defers flushes; WAL is read to the flush
    lease = ledger.acquire_lease("r1", TTL)
    ledger.start_run("r1", dry_run=False, options={}, lease_token=lease.token)
    lease = ledger.commit_batch("r1", "b1", lease, TTL, [outcome(f"k{i}", crm=f"a0M{i}") for i in range(10)],
                                BatchCounts(10)).lease
    start = control_conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    known = [outcome(f"k{i}", h="h2", crm=None, status="retryable_failed", code="TIMEOUT", attempt=2, delay=5)
             for i in range(10)]
    ledger.commit_batch("r1", "b2", lease, TTL, known + [outcome(f"n{i}") for i in range(10)], BatchCounts(10, 10))
    writes = _wal_writes(control_conn, start, ["outbound_records", "outbound_attempt_batches", "outbound_attempt_batches_xid",
                                               "outbound_attempt_batches_run", "outbound_attempt_batches_time"])
    assert ("Heap/HEAP_CONFIRM", "outbound_records") not in writes
    assert sum(kind.startswith("Heap/INSERT") for kind, relation in writes if relation == "outbound_records") == 10
    assert sum(kind.startswith("Heap/INSERT") for kind, r in writes if r == "outbound_attempt_batches") == 1
    assert sum(kind.startswith("Btree/INSERT") for kind, r in writes if r == "outbound_attempt_batches_xid") == 1
    attempts = control_conn.execute(
        "SELECT external_id, payload_hash, attempt_number, status, crm_record_id, http_status, error_code, "
        "error_message, duration_ms FROM outbound_record_attempts WHERE job_name = %s AND batch_id = 'b2' "
        "ORDER BY external_id", (ledger.job_name,)).fetchall()
    assert len(attempts) == 20
    assert attempts[3] == ("k3", "h2", 2, "retryable_failed", None, 200, "TIMEOUT", "msg", 12)
    assert attempts[13] == ("n3", "h1", 1, "succeeded", "a0M1", 200, None, None, 12)
    rows = {r["external_id"]: r for r in ledger.record_rows()}
    assert len(rows) == 20 and rows["k3"]["status"] == "retryable_failed" and rows["k3"]["crm_record_id"] == "a0M3"
    assert rows["k3"]["last_success_run_id"] == "r1" and rows["k3"]["attempt_count"] == 2
    assert rows["n3"]["status"] == "succeeded" and rows["n3"]["attempt_count"] == 1


def test_attempts_recorded_one_row_each_come_back_unchanged_after_the_move_to_batch_rows(empty_dsn, tmp_path):
    """Migration 0029 groups the attempt rows of the row-per-attempt table into batch rows;
    the view shows every one of them as it was, and the next batch commit appends to them."""
    import shutil

    from nexus_pipelines.control.db import connect
    from nexus_pipelines.control.migrations import MIGRATIONS_DIR, apply_migrations

    before = tmp_path / "before"
    before.mkdir()
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        if int(path.name.split("_", 1)[0]) < 29:
            shutil.copy(path, before / path.name)
    apply_migrations(empty_dsn, directory=before)
    columns = ("attempted_at, job_name, run_id, batch_id, external_id, payload_hash, attempt_number, status, "
               "crm_record_id, http_status, error_code, error_message, duration_ms, recorded_xid")
    with connect(empty_dsn) as conn:
        conn.execute(
            f"INSERT INTO outbound_record_attempts ({columns.replace(', recorded_xid', '')}) VALUES "
            "('2026-11-01 10:00:00+00', 'j', 'r0', 'r0:1', 'a', 'h1', 1, 'succeeded', 'a0M1', 200, NULL, NULL, 9), "
            "('2026-11-01 10:00:01+00', 'j', 'r0', 'r0:1', 'b', 'h2', 3, 'permanent_failed', NULL, 200, 'E', 'm', 9)")
        conn.execute(  # one transaction: one recorded_xid for the batch's rows
            f"INSERT INTO outbound_record_attempts ({columns.replace(', recorded_xid', '')}) VALUES "
            "('2026-11-02 10:00:00+00', 'j', 'r1', 'r1:1', 'a', 'h3', 1, 'retryable_failed', NULL, 503, 'T', 't', 40), "
            "('2026-11-02 10:00:00+00', 'j', 'r1', 'r1:1', 'c', 'h4', 1, 'succeeded', 'a0M3', 503, NULL, NULL, 40)")
        old = sorted(conn.execute(f"SELECT {columns} FROM outbound_record_attempts").fetchall())
    apply_migrations(empty_dsn)
    with connect(empty_dsn) as conn:
        assert sorted(conn.execute(f"SELECT {columns} FROM outbound_record_attempts").fetchall()) == old
        assert conn.execute("SELECT count(*) FROM outbound_attempt_batches").fetchone()[0] == 3
        Ledger(conn, "j", "Month_End_ARR__c").commit_batch("r2", "r2:1", None, TTL, [outcome("a", h="h5")],
                                                           BatchCounts(1))
        assert conn.execute("SELECT count(*) FROM outbound_record_attempts WHERE job_name = 'j'").fetchone()[0] == 5
