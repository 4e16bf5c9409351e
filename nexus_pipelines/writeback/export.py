"""Publish the four ledger tables from Postgres to the BigQuery control dataset, so
analysts can join them with warehouse data (the writeback's original design keeps them in BigQuery; here
Postgres is the source of truth and BigQuery holds a refreshed copy)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, datetime
from decimal import Decimal

import psycopg
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
        ("duration_ms", I, "NULLABLE"),
    ],
}


def _json_value(value):
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def _rows(conn: psycopg.Connection, table: str, columns: list[str], chunk: int) -> Iterator[list[dict]]:
    with conn.transaction(), conn.cursor(name=f"export_{table}") as cur:
        cur.itersize = chunk
        cur.execute(f"SELECT {', '.join(columns)} FROM {table}")  # names from TABLES only
        while True:
            rows = cur.fetchmany(chunk)
            if not rows:
                return
            yield [{c: _json_value(v) for c, v in zip(columns, r, strict=True)} for r in rows]


def export_ledger(conn: psycopg.Connection, client: bigquery.Client, project: str, dataset: str, *,
                  chunk: int = 5000) -> dict[str, int]:
    """Replace each ledger table in `project.dataset` with the current Postgres rows."""
    client.create_dataset(f"{project}.{dataset}", exists_ok=True)
    counts: dict[str, int] = {}
    for table, fields in TABLES.items():
        table_id = f"{project}.{dataset}.{table}"
        schema = [bigquery.SchemaField(name, kind, mode=mode) for name, kind, mode in fields]
        client.delete_table(table_id, not_found_ok=True)
        target = bigquery.Table(table_id, schema=schema)
        if table == "outbound_record_attempts":
            target.time_partitioning = bigquery.TimePartitioning(field="attempted_at", expiration_ms=90 * 86_400_000)
        client.create_table(target)
        total = 0
        for rows in _rows(conn, table, [f[0] for f in fields], chunk):
            errors = client.insert_rows_json(table_id, rows)
            if errors:
                raise RuntimeError(f"BigQuery refused {len(errors)} rows exporting {table}")
            total += len(rows)
        counts[table] = total
    return counts
