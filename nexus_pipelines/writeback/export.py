"""Publish the four ledger tables from Postgres to the BigQuery control dataset, so
analysts can join them with warehouse data (Postgres is the source of truth; BigQuery
holds a copy), by load jobs, never streaming inserts:

- leases, runs and records are small: each is replaced by one load job with
  WRITE_TRUNCATE from a file of the whole table. BigQuery swaps the table when the job
  succeeds, and nothing is sent before the file is complete, so readers see the previous
  copy or the new one, whole, whatever fails.
- attempts are append-only and kept 90 days: each export appends (WRITE_APPEND) only the
  rows committed since the last one, tracked durably in `ledger_export_marks` by
  Postgres snapshots (see sql/control/0024); the first export of a dataset, or one whose
  attempts table is gone, loads them all with WRITE_TRUNCATE.

Files are newline-delimited JSON sent as a resumable upload (no size given):
`load_table_from_dataframe` and `load_table_from_json` send a multipart upload whose
media part the BigQuery emulator refuses, and real BigQuery takes both.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime
from decimal import Decimal

import psycopg
from google.api_core.exceptions import GoogleAPIError, NotFound
from google.cloud import bigquery

S, T, I, B = "STRING", "TIMESTAMP", "INT64", "BOOL"

TABLES: dict[str, list[tuple[str, str, str]]] = {
    "outbound_job_leases": [
        ("job_name", S, "REQUIRED"), ("owner_run_id", S, "REQUIRED"), ("acquired_at", T, "REQUIRED"),
        ("heartbeat_at", T, "REQUIRED"), ("expires_at", T, "REQUIRED"), ("fencing_token", I, "NULLABLE"),
    ],
    "outbound_runs": [
        ("job_name", S, "REQUIRED"), ("run_id", S, "REQUIRED"), ("source_run_id", S, "NULLABLE"),
        ("source_cutoff_at", T, "NULLABLE"), ("status", S, "REQUIRED"), ("selected_rows", I, "NULLABLE"),
        ("unchanged_rows", I, "NULLABLE"), ("succeeded_rows", I, "NULLABLE"), ("retryable_failed_rows", I, "NULLABLE"),
        ("permanently_failed_rows", I, "NULLABLE"), ("started_at", T, "REQUIRED"), ("ended_at", T, "NULLABLE"),
        ("error_message", S, "NULLABLE"), ("dry_run", B, "NULLABLE"), ("batches", I, "NULLABLE"),
        ("crm_calls", I, "NULLABLE"), ("crm_api_usage", S, "NULLABLE"), ("execution_id", S, "REQUIRED"),
    ],
    "outbound_records": [
        ("job_name", S, "REQUIRED"), ("target_object", S, "REQUIRED"), ("external_id", S, "REQUIRED"),
        ("payload_hash", S, "REQUIRED"), ("source_version", S, "NULLABLE"), ("crm_record_id", S, "NULLABLE"),
        ("status", S, "REQUIRED"), ("attempt_count", I, "REQUIRED"), ("last_attempt_run_id", S, "NULLABLE"),
        ("last_success_run_id", S, "NULLABLE"), ("next_retry_at", T, "NULLABLE"), ("error_code", S, "NULLABLE"),
        ("error_message", S, "NULLABLE"), ("updated_at", T, "REQUIRED"),
    ],
    "outbound_record_attempts": [
        ("attempted_at", T, "REQUIRED"), ("job_name", S, "REQUIRED"), ("run_id", S, "REQUIRED"),
        ("batch_id", S, "REQUIRED"), ("external_id", S, "REQUIRED"), ("payload_hash", S, "REQUIRED"),
        ("attempt_number", I, "REQUIRED"), ("status", S, "REQUIRED"), ("crm_record_id", S, "NULLABLE"),
        ("http_status", I, "NULLABLE"), ("error_code", S, "NULLABLE"), ("error_message", S, "NULLABLE"),
        ("duration_ms", I, "NULLABLE"), ("export_id", S, "NULLABLE"),
    ],
}
ATTEMPTS = "outbound_record_attempts"
RETENTION_MS = 90 * 86_400_000


class LedgerExportError(RuntimeError):
    """The export could not run or BigQuery refused a load; the message says which table and why."""


def _json_value(value):
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def _spool(conn: psycopg.Connection, query: str, params: dict, columns: list[str], chunk: int,
           extra: dict | None = None) -> tuple[tempfile.SpooledTemporaryFile, int]:
    """The query's rows as a newline-delimited JSON file (rewound) and their count."""
    spool = tempfile.SpooledTemporaryFile(max_size=64 * 1024 * 1024, mode="r+b")  # the client uploads only r+b
    count = 0
    with conn.transaction(), conn.cursor(name="ledger_export") as cur:
        cur.itersize = chunk
        cur.execute(query, params)
        while rows := cur.fetchmany(chunk):
            for row in rows:
                record = {c: _json_value(v) for c, v in zip(columns, row, strict=True)} | (extra or {})
                spool.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
            count += len(rows)
    spool.seek(0)
    return spool, count


def _schema(table_id: str) -> list[bigquery.SchemaField]:
    return [bigquery.SchemaField(name, kind, mode=mode) for name, kind, mode in TABLES[table_id.rsplit(".", 1)[1]]]


def _partitioning(table_id: str) -> bigquery.TimePartitioning | None:
    """Attempts are partitioned by day and expire with the Postgres retention."""
    if table_id.rsplit(".", 1)[1] != ATTEMPTS:
        return None
    return bigquery.TimePartitioning(field="attempted_at", expiration_ms=RETENTION_MS)


def _load(client: bigquery.Client, table_id: str, spool, disposition: str) -> None:
    config = bigquery.LoadJobConfig(schema=_schema(table_id), source_format=bigquery.SourceFormat.NEWLINE_DELIMITED_JSON,
                                    write_disposition=disposition, time_partitioning=_partitioning(table_id))
    try:
        client.load_table_from_file(spool, table_id, job_config=config).result()
    except GoogleAPIError as exc:
        raise LedgerExportError(f"BigQuery refused the load job of {table_id}: {getattr(exc, 'message', exc)}") from exc


def _truncate_to_empty(client: bigquery.Client, table_id: str) -> None:
    """An empty source: the table with its schema and no rows (an empty upload is no load job)."""
    table = bigquery.Table(table_id, schema=_schema(table_id))
    table.time_partitioning = _partitioning(table_id)
    client.create_table(table, exists_ok=True)
    client.query(f"TRUNCATE TABLE `{table_id}`").result()


def _replace(conn: psycopg.Connection, client: bigquery.Client, table_id: str, chunk: int) -> int:
    table = table_id.rsplit(".", 1)[1]
    columns = [f[0] for f in TABLES[table]]
    spool, count = _spool(conn, f"SELECT {', '.join(columns)} FROM {table}", {}, columns, chunk)  # names from TABLES
    with spool:
        if count:
            _load(client, table_id, spool, bigquery.WriteDisposition.WRITE_TRUNCATE)
        else:
            _truncate_to_empty(client, table_id)
    return count


_DELTA = f"""
    SELECT {{columns}} FROM {ATTEMPTS}
    WHERE (%(since)s::pg_snapshot IS NULL OR (recorded_xid >= pg_snapshot_xmin(%(since)s::pg_snapshot)
                                              AND NOT pg_visible_in_snapshot(recorded_xid, %(since)s::pg_snapshot)))
      AND (recorded_xid IS NULL OR pg_visible_in_snapshot(recorded_xid, %(upto)s::pg_snapshot))
"""


@contextmanager
def _exclusive(conn: psycopg.Connection, destination: str) -> Iterator[None]:
    """One export per destination at a time (a session lock: a dead exporter's ends with its connection)."""
    key = f"ledger_export:{destination}"
    if not conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,)).fetchone()[0]:
        raise LedgerExportError(f"another ledger export to {destination} is running; wait for it to finish")
    try:
        yield
    finally:
        conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))


def _begin_increment(conn: psycopg.Connection, client: bigquery.Client, table_id: str) -> tuple[str | None, str, str]:
    """(since, upto, export id) of the increment to append, made durable before any load.

    A pending increment (an export died after starting it) is taken up again after deleting
    whatever part of it reached BigQuery; a missing BigQuery table starts from nothing."""
    with conn.transaction():
        conn.execute("INSERT INTO ledger_export_marks (destination) VALUES (%s) ON CONFLICT DO NOTHING", (table_id,))
        exported, pending, pending_id = conn.execute(
            "SELECT exported::text, pending::text, pending_id FROM ledger_export_marks WHERE destination = %s FOR UPDATE",
            (table_id,)).fetchone()
        try:
            client.get_table(table_id)
        except NotFound:
            exported = None
        if pending is not None:
            if exported is not None:
                client.query(f"DELETE FROM `{table_id}` WHERE export_id = @id", job_config=bigquery.QueryJobConfig(
                    query_parameters=[bigquery.ScalarQueryParameter("id", "STRING", pending_id)])).result()
            return exported, pending, pending_id
        pending_id = uuid.uuid4().hex
        upto = conn.execute(
            "UPDATE ledger_export_marks SET exported = %s::pg_snapshot, pending = pg_current_snapshot(), pending_id = %s,"
            " updated_at = now() WHERE destination = %s RETURNING pending::text",
            (exported, pending_id, table_id)).fetchone()[0]
        return exported, upto, pending_id


def _load_increment(conn: psycopg.Connection, client: bigquery.Client, table_id: str, chunk: int) -> int:
    """Load the attempts committed since the last recorded export; `_record_increment` then records it."""
    since, upto, export_id = _begin_increment(conn, client, table_id)
    columns = [f[0] for f in TABLES[ATTEMPTS] if f[0] != "export_id"]
    spool, count = _spool(conn, _DELTA.format(columns=", ".join(columns)), {"since": since, "upto": upto},
                          columns, chunk, extra={"export_id": export_id})
    with spool:
        if since is None and not count:
            _truncate_to_empty(client, table_id)
        elif count:
            disposition = bigquery.WriteDisposition.WRITE_TRUNCATE if since is None else bigquery.WriteDisposition.WRITE_APPEND
            _load(client, table_id, spool, disposition)
    return count


def _record_increment(conn: psycopg.Connection, table_id: str) -> None:
    conn.execute("UPDATE ledger_export_marks SET exported = pending, pending = NULL, pending_id = NULL, updated_at = now()"
                 " WHERE destination = %s", (table_id,))


def _append_attempts(conn: psycopg.Connection, client: bigquery.Client, table_id: str, chunk: int) -> int:
    count = _load_increment(conn, client, table_id, chunk)
    _record_increment(conn, table_id)
    return count


def export_ledger(conn: psycopg.Connection, client: bigquery.Client, project: str, dataset: str, *,
                  chunk: int = 5000) -> dict[str, int]:
    """Copy the ledger to `project.dataset`: per table, the rows this export loaded (all of leases, runs
    and records; the attempts committed since the previous export)."""
    client.create_dataset(f"{project}.{dataset}", exists_ok=True)
    counts: dict[str, int] = {}
    with _exclusive(conn, f"{project}.{dataset}"):
        for table in TABLES:
            table_id = f"{project}.{dataset}.{table}"
            load = _append_attempts if table == ATTEMPTS else _replace
            counts[table] = load(conn, client, table_id, chunk)
    return counts
