"""The BigQuery side of a writeback run (docs/design/writeback-run.md, "Steps": readiness and the candidate table).

Readiness (exactly one authoritative row), freshness from
`_outbound_source_as_of_at`, the run-scoped candidate table (materialized once, 24 h
expiration, deleted in cleanup), set-based null/duplicate key checks, and candidate
rows streamed page by page: with the BigQuery Storage Read API (Arrow) when the run has
a read client, else (and when the API is refused) by keyset pages in stable
`_outbound_external_id` order.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
from google.api_core import exceptions as gexc
from google.cloud import bigquery
from google.cloud.bigquery_storage_v1 import BigQueryReadClient, types

from nexus_pipelines.writeback.mapping import EXTERNAL_ID_COLUMN

READINESS_COLUMNS: dict[str, str] = {
    "_outbound_source_run_id": "STRING",
    "_outbound_source_as_of_at": "TIMESTAMP",
    "_outbound_source_ready": "BOOL",
    "_outbound_source_reason": "STRING",
}
CANDIDATE_TTL = timedelta(hours=24)
EXPIRES_LABEL = "nexus_expires_at"


class SourceError(RuntimeError):
    """The source breaks its contract or is not ready; nothing was written."""


@dataclass(frozen=True)
class Readiness:
    source_run_id: str
    as_of_at: datetime
    ready: bool
    reason: str | None

    def age(self, now: datetime) -> timedelta:
        return now - self.as_of_at


@dataclass
class WarehouseTimer:
    """Wall time spent waiting on BigQuery (queries and result pages)."""

    seconds: float = 0.0
    queries: int = 0

    def add(self, started: float) -> None:
        self.seconds += time.perf_counter() - started
        self.queries += 1


def _job_config(params: Sequence[Any] = ()) -> bigquery.QueryJobConfig:
    return bigquery.QueryJobConfig(query_parameters=list(params))


def run_readiness(client: bigquery.Client, sql: str, *, location: str | None = None,
                  timer: WarehouseTimer | None = None) -> Readiness:
    started = time.perf_counter()
    result = client.query(sql, job_config=_job_config(), location=location).result()
    rows = list(result)
    if timer:
        timer.add(started)
    if len(rows) != 1:
        raise SourceError(f"readiness query must return exactly one row, got {len(rows)}")
    schema = {f.name: f.field_type.upper() for f in result.schema}
    problems = []
    for column, kind in READINESS_COLUMNS.items():
        got = schema.get(column)
        if got is None:
            problems.append(f"column {column} is missing")
        elif got not in (kind, "BOOLEAN" if kind == "BOOL" else kind):
            problems.append(f"column {column} is {got}, expected {kind}")
    if problems:
        raise SourceError("readiness query breaks the contract: " + "; ".join(problems))
    row = rows[0]
    run_id, as_of, ready, reason = (row[c] for c in READINESS_COLUMNS)
    if not isinstance(run_id, str) or not run_id:
        raise SourceError("readiness _outbound_source_run_id is null or empty")
    if not isinstance(as_of, datetime):
        raise SourceError("readiness _outbound_source_as_of_at is null")
    if not isinstance(ready, bool):
        raise SourceError("readiness _outbound_source_ready is null")
    if as_of.tzinfo is None:
        as_of = as_of.replace(tzinfo=UTC)
    return Readiness(run_id, as_of, ready, reason)


def freshness_problem(readiness: Readiness, max_age_minutes: int, now: datetime) -> str | None:
    age = readiness.age(now)
    if age > timedelta(minutes=max_age_minutes):
        return (f"source run {readiness.source_run_id} is {int(age.total_seconds() // 60)} minutes old, "
                f"older than freshness_max_age_minutes={max_age_minutes}")
    return None


def candidate_table_id(project: str, dataset: str, job_name: str, run_id: str, execution_id: str) -> str:
    """The run-scoped table of one execution (two executions of a run id never share one)."""
    safe = re.sub(r"[^A-Za-z0-9_]", "_", run_id)[:80]
    return f"{project}.{dataset}.wb_candidates_{job_name}_{safe}_{execution_id}"


@dataclass(frozen=True)
class CandidateTable:
    table_id: str
    row_count: int
    schema: dict[str, str] = field(default_factory=dict)


def materialize_candidates(client: bigquery.Client, table_id: str, source_sql: str, *,
                           external_ids: Sequence[str] = (), location: str | None = None,
                           timer: WarehouseTimer | None = None) -> CandidateTable:
    """Run the source query once into the run-scoped table (24 h expiration). With
    `external_ids`, only those rows are materialized (canary / repair runs)."""
    project, dataset, _ = table_id.split(".")
    client.create_dataset(f"{project}.{dataset}", exists_ok=True)
    hours = int(CANDIDATE_TTL.total_seconds() // 3600)
    where = ""
    params: list = []
    if external_ids:
        where = f" WHERE {EXTERNAL_ID_COLUMN} IN UNNEST(@external_ids)"
        params.append(bigquery.ArrayQueryParameter("external_ids", "STRING", sorted(set(external_ids))))
    ddl = (
        f"CREATE OR REPLACE TABLE `{table_id}` "
        # Clustered by the key: each keyset page reads a key range, not the whole table.
        f"CLUSTER BY {EXTERNAL_ID_COLUMN} "
        f"OPTIONS(expiration_timestamp=TIMESTAMP_ADD(CURRENT_TIMESTAMP(), INTERVAL {hours} HOUR)) AS "
        f"SELECT * FROM (\n{source_sql.strip().rstrip(';')}\n) AS source{where}"
    )
    started = time.perf_counter()
    client.query(ddl, job_config=_job_config(params), location=location).result()
    table = client.get_table(table_id)
    if table.expires is None:
        # Some endpoints (the local emulator) drop the DDL option: set it again through
        # the table API and keep the intended expiry as a label that survives either way.
        expires = datetime.now(UTC) + CANDIDATE_TTL
        table.expires = expires
        table.labels = {**(table.labels or {}), EXPIRES_LABEL: str(int(expires.timestamp()))}
        table = client.update_table(table, ["expires", "labels"])
    if timer:
        timer.add(started)
    schema = {f.name: f.field_type.upper() for f in table.schema}
    count = table.num_rows
    if count is None:
        count = next(iter(client.query(f"SELECT COUNT(*) AS n FROM `{table_id}`").result()))["n"]
    return CandidateTable(table_id, int(count), schema)


def missing_external_ids(client: bigquery.Client, table_id: str, external_ids: Sequence[str], *,
                         location: str | None = None, timer: WarehouseTimer | None = None) -> list[str]:
    """The external IDs asked for (a canary) that the candidate table does not hold, sorted."""
    sql = (f"SELECT id FROM UNNEST(@ids) AS id WHERE id NOT IN "
           f"(SELECT {EXTERNAL_ID_COLUMN} FROM `{table_id}` WHERE {EXTERNAL_ID_COLUMN} IS NOT NULL) ORDER BY id")
    params = [bigquery.ArrayQueryParameter("ids", "STRING", sorted(set(external_ids)))]
    started = time.perf_counter()
    rows = client.query(sql, job_config=_job_config(params), location=location).result()
    missing = [row["id"] for row in rows]
    if timer:
        timer.add(started)
    return missing


def candidate_expiry(client: bigquery.Client, table_id: str) -> datetime | None:
    """The table's expiration: from BigQuery, else from the label set at creation."""
    table = client.get_table(table_id)
    if table.expires is not None:
        return table.expires
    label = (table.labels or {}).get(EXPIRES_LABEL)
    return datetime.fromtimestamp(int(label), UTC) if label else None


def drop_candidates(client: bigquery.Client, table_id: str) -> None:
    client.delete_table(table_id, not_found_ok=True)


@dataclass(frozen=True)
class KeyReport:
    rows: int
    null_or_empty: int
    duplicate_ids: int  # distinct external IDs that occur more than once
    duplicate_samples: tuple[str, ...]


def check_keys(client: bigquery.Client, table_id: str, *, location: str | None = None,
               timer: WarehouseTimer | None = None, samples: int = 5) -> KeyReport:
    """Null/empty and duplicate external IDs, with two set-based queries."""
    started = time.perf_counter()
    counts = next(iter(client.query(
        f"SELECT COUNT(*) AS n, "
        f"COUNTIF({EXTERNAL_ID_COLUMN} IS NULL OR TRIM({EXTERNAL_ID_COLUMN}) = '') AS null_keys, "
        f"COUNT(DISTINCT {EXTERNAL_ID_COLUMN}) AS distinct_keys, "
        f"COUNTIF({EXTERNAL_ID_COLUMN} IS NOT NULL) AS non_null_keys "
        f"FROM `{table_id}`", location=location).result()))
    duplicate_ids = 0
    sample: tuple[str, ...] = ()
    if counts["distinct_keys"] != counts["non_null_keys"]:
        dupes = list(client.query(
            f"SELECT {EXTERNAL_ID_COLUMN} AS id, COUNT(*) OVER () AS total FROM `{table_id}` "
            f"WHERE {EXTERNAL_ID_COLUMN} IS NOT NULL GROUP BY {EXTERNAL_ID_COLUMN} HAVING COUNT(*) > 1 "
            f"ORDER BY id LIMIT {int(samples)}", location=location).result())
        duplicate_ids = int(dupes[0]["total"]) if dupes else 0
        sample = tuple(r["id"] for r in dupes)
    if timer:
        timer.add(started)
    return KeyReport(int(counts["n"]), int(counts["null_keys"]), duplicate_ids, sample)


def iter_candidate_pages(client: bigquery.Client, table_id: str, *, page_size: int = 5000,
                         location: str | None = None, timer: WarehouseTimer | None = None,
                         max_pages: int = 10_000_000) -> Iterator[list[dict[str, Any]]]:
    """Candidate rows in `_outbound_external_id` order, one keyset page at a time, so
    memory holds one page however large the table is."""
    after: str | None = None
    for _ in range(max_pages):
        where = f"WHERE {EXTERNAL_ID_COLUMN} > @after " if after is not None else ""
        params = [bigquery.ScalarQueryParameter("after", "STRING", after)] if after is not None else []
        sql = (f"SELECT * FROM `{table_id}` {where}"
               f"ORDER BY {EXTERNAL_ID_COLUMN} LIMIT {int(page_size)}")
        started = time.perf_counter()
        page = [dict(row.items()) for row in client.query(sql, job_config=_job_config(params), location=location).result()]
        if timer:
            timer.add(started)
        if not page:
            return
        yield page
        after = page[-1][EXTERNAL_ID_COLUMN]
        if len(page) < page_size:
            return


READ_SESSION_ROLE = "roles/bigquery.readSessionUser"


@contextmanager
def storage_read_client(bq: bigquery.Client, *, enabled: bool = True) -> Iterator[BigQueryReadClient | None]:
    """A Storage Read API client with `bq`'s credentials (closed when the block ends), or
    None when disabled: the candidates are then read with queries."""
    if not enabled:
        yield None
        return
    # The library's own factory for its Arrow downloads: the client's credentials and universe.
    storage = bq._ensure_bqstorage_client()
    try:
        yield storage
    finally:
        if storage is not None:
            storage.transport.close()


def emulator_read_client(endpoint: str) -> BigQueryReadClient:
    """A Storage Read API client on the local emulator's gRPC endpoint ("host:port", plain text)."""
    import grpc
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.bigquery_storage_v1.services.big_query_read.transports import BigQueryReadGrpcTransport

    # No message size cap, as the client's own channels: a ReadRows response can exceed gRPC's 4 MiB default.
    channel = grpc.insecure_channel(endpoint, options=[("grpc.max_receive_message_length", -1)])
    return BigQueryReadClient(transport=BigQueryReadGrpcTransport(channel=channel, credentials=AnonymousCredentials()))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_ORDINAL = _EPOCH.date().toordinal()


def _rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The batch's rows as `to_pylist()` makes them, the same values built from the integers of
    two column types: a TIMESTAMP column (Arrow microseconds in UTC) gives datetimes in
    `datetime.UTC`, as the query pages do (pyarrow gives each value a `ZoneInfo('UTC')` at about
    five times the cost, which the mapper then had to convert to `UTC` again), and a DATE column
    (Arrow days since the epoch) gives dates at a tenth of pyarrow's cost."""
    names = batch.schema.names
    return [dict(zip(names, row)) for row in zip(*(_values(column) for column in batch.columns))]


def _values(column: pa.Array) -> list[Any]:
    kind = column.type
    if pa.types.is_timestamp(kind) and kind.tz == "UTC" and kind.unit == "us":
        return [None if us is None else _EPOCH + timedelta(microseconds=us)
                for us in column.cast(pa.int64()).to_pylist()]
    if pa.types.is_date32(kind):
        return [None if days is None else date.fromordinal(_EPOCH_ORDINAL + days)
                for days in column.cast(pa.int32()).to_pylist()]
    return column.to_pylist()


class CandidateReader:
    """The candidate table, page by page, for the validation pass and again for the write
    pass. With a Storage Read client it streams the table as Arrow record batches (one
    read session of one stream per pass, in the table's order); without one, or once the
    API is refused, it runs keyset-paged queries (`iter_candidate_pages`)."""

    def __init__(self, client: bigquery.Client, table_id: str, *, storage: BigQueryReadClient | None = None,
                 location: str | None = None, timer: WarehouseTimer | None = None) -> None:
        self.client = client
        self.table_id = table_id
        self.storage = storage
        self.location = location
        self.timer = timer
        self.refused: str | None = None  # why the Storage Read API was refused, once

    @property
    def path(self) -> str:
        return "storage_read_api" if self.storage is not None else "query_pages"

    def pages(self, page_size: int) -> Iterator[list[dict[str, Any]]]:
        if self.storage is not None:
            try:
                batches = self._arrow_batches()
            except gexc.PermissionDenied as exc:
                self.refused = (f"the BigQuery Storage Read API was refused ({exc.message}); the candidates are "
                                f"read with queries instead: grant {READ_SESSION_ROLE} (bigquery.readsessions.*) "
                                f"on project {self.client.project} to read them faster")
                self.storage = None
            else:
                for batch in batches:
                    for offset in range(0, batch.num_rows, page_size):
                        yield _rows(batch.slice(offset, page_size))
                return
        yield from iter_candidate_pages(self.client, self.table_id, page_size=page_size, location=self.location,
                                        timer=self.timer)

    def _arrow_batches(self) -> Iterator[pa.RecordBatch]:
        """Open the read session and its stream and read the first batch, so that a refusal
        (CreateReadSession, or ReadRows checking `getData`) raises here, before any row."""
        started = time.perf_counter()
        project, dataset, table = self.table_id.split(".")
        session = self.storage.create_read_session(
            parent=f"projects/{self.client.project}",
            read_session=types.ReadSession(table=f"projects/{project}/datasets/{dataset}/tables/{table}",
                                           data_format=types.DataFormat.ARROW),
            max_stream_count=1)
        if not session.streams:  # an empty table has no stream
            self._add(started)
            return iter(())
        schema = pa.ipc.read_schema(pa.py_buffer(session.arrow_schema.serialized_schema))
        responses = iter(self.storage.read_rows(session.streams[0].name))
        first = next(responses, None)
        self._add(started)
        return self._decoded(first, responses, schema)

    def _decoded(self, first, responses, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        response = first
        while response is not None:
            yield pa.ipc.read_record_batch(pa.py_buffer(response.arrow_record_batch.serialized_record_batch), schema)
            started = time.perf_counter()
            response = next(responses, None)
            self._add(started)

    def _add(self, started: float) -> None:
        if self.timer:
            self.timer.add(started)
