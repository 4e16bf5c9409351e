"""Read-only views of the writeback ledger for operators (`nexus-pipelines writeback ...`).

Each listing is one parameterized query over fixed columns, newest first, bounded by a
limit; each filter is a fixed condition with one parameter (mostly a column's equality).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psycopg import Connection, sql


@dataclass(frozen=True)
class Listing:
    table: str
    columns: tuple[str, ...]
    filters: Mapping[str, sql.Composable]  # filter name -> condition with one %s
    order: str


def _equals(column: str) -> sql.Composable:
    return sql.SQL("{} = %s").format(sql.Identifier(column))


# An execution sent an external id when the ledger holds an attempt of it in one of the
# execution's batches (batch ids are '<run_id>:<execution_id>:<n>'; attempts are kept 90 days).
_RUN_SENT = sql.SQL("EXISTS (SELECT 1 FROM outbound_record_attempts a WHERE a.job_name = outbound_runs.job_name "
                    "AND a.run_id = outbound_runs.run_id AND a.external_id = %s "
                    "AND starts_with(a.batch_id, outbound_runs.run_id || ':' || outbound_runs.execution_id || ':'))")

RUNS = Listing(
    "outbound_runs",
    ("job_name", "run_id", "execution_id", "status", "started_at", "ended_at", "selected_rows", "unchanged_rows", "succeeded_rows",
     "retryable_failed_rows", "permanently_failed_rows", "batches", "crm_calls", "crm_api_usage", "source_run_id",
     "error_message"),
    {"job": _equals("job_name"), "status": _equals("status"), "external_id": _RUN_SENT, "run_id": _equals("run_id")},
    "started_at DESC, run_id, execution_id",
)
RECORDS = Listing(
    "outbound_records",
    ("job_name", "external_id", "status", "attempt_count", "crm_record_id", "error_code", "next_retry_at",
     "last_attempt_run_id", "last_success_run_id", "updated_at", "error_message"),
    {"job": _equals("job_name"), "status": _equals("status"), "external_id": _equals("external_id"),
     "run_id": _equals("last_attempt_run_id")},
    "updated_at DESC, job_name, external_id",
)
ATTEMPTS = Listing(
    "outbound_record_attempts",
    ("attempted_at", "job_name", "run_id", "batch_id", "external_id", "attempt_number", "status", "http_status",
     "crm_record_id", "error_code", "duration_ms", "error_message"),
    {"job": _equals("job_name"), "status": _equals("status"), "external_id": _equals("external_id"),
     "run_id": _equals("run_id")},
    "attempted_at DESC, external_id",
)


def fetch(conn: Connection, listing: Listing, *, limit: int, **filters: Any) -> list[dict[str, Any]]:
    """Rows of `listing` matching every given filter (None: no filter), as dicts."""
    where, params = [], []
    for name, value in filters.items():
        if value is not None:
            where.append(listing.filters[name])
            params.append(value)
    query = sql.SQL("SELECT {columns} FROM {table}{where} ORDER BY {order} LIMIT %s").format(
        columns=sql.SQL(", ").join(sql.Identifier(c) for c in listing.columns),
        table=sql.Identifier(listing.table),
        where=sql.SQL(" WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL(""),
        order=sql.SQL(listing.order),
    )
    rows = conn.execute(query, [*params, limit]).fetchall()
    return [dict(zip(listing.columns, row, strict=True)) for row in rows]
