"""Source contract on the BigQuery emulator: readiness, freshness, candidate table,
set-based key checks, stable paging."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta

import pytest

from nexus_pipelines.writeback.jobs.month_end_arr.mapping import MonthEndArrMapper
from nexus_pipelines.writeback.source import (
    CANDIDATE_TTL,
    Readiness,
    SourceError,
    candidate_expiry,
    CandidateReader,
    candidate_table_id,
    check_keys,
    drop_candidates,
    freshness_problem,
    iter_candidate_pages,
    materialize_candidates,
    run_readiness,
    storage_read_client,
)

from .support import make_config, seed_source

READY = ("SELECT 'load-1' AS _outbound_source_run_id, TIMESTAMP '2026-11-01 00:00:00+00' AS _outbound_source_as_of_at, "
         "TRUE AS _outbound_source_ready, CAST(NULL AS STRING) AS _outbound_source_reason")


def test_readiness_returns_the_authoritative_row(bq_client):
    r = run_readiness(bq_client, READY)
    assert r == Readiness("load-1", datetime(2026, 11, 1, tzinfo=UTC), True, None)


@pytest.mark.parametrize("sql,message", [
    (READY + " UNION ALL " + READY, "exactly one row, got 2"),
    (READY + " LIMIT 0", "exactly one row, got 0"),
    ("SELECT 'x' AS _outbound_source_run_id, TRUE AS _outbound_source_ready, CAST(NULL AS STRING) AS _outbound_source_reason",
     "_outbound_source_as_of_at is missing"),
    ("SELECT 'x' AS _outbound_source_run_id, CAST(NULL AS TIMESTAMP) AS _outbound_source_as_of_at, "
     "TRUE AS _outbound_source_ready, CAST(NULL AS STRING) AS _outbound_source_reason", "as_of_at is null"),
    ("SELECT 'x' AS _outbound_source_run_id, '2026-01-01' AS _outbound_source_as_of_at, "
     "TRUE AS _outbound_source_ready, CAST(NULL AS STRING) AS _outbound_source_reason", "expected TIMESTAMP"),
])
def test_readiness_contract_violations_fail_closed(bq_client, sql, message):
    with pytest.raises(SourceError, match=message):
        run_readiness(bq_client, sql)


def test_a_load_in_progress_makes_the_month_end_arr_source_not_ready(bq_client):
    from nexus_pipelines.writeback.config import render_sql
    from nexus_pipelines.settings import PROJECT_ROOT

    dataset = f"runs_{uuid.uuid4().hex[:8]}"
    bq_client.create_dataset(dataset)
    bq_client.query(
        f"""CREATE TABLE {dataset}.pipeline_runs AS
            SELECT 'load-1' AS run_id, 'month_end_arr' AS pipeline, 'succeeded' AS status,
                   TIMESTAMP '2026-11-01 00:00:00+00' AS finished_at
            UNION ALL
            SELECT 'load-2', 'month_end_arr', 'running', CAST(NULL AS TIMESTAMP)"""
    ).result()
    sql = render_sql((PROJECT_ROOT / "sql/jobs/month_end_arr-readiness.sql").read_text(), {"source_dataset": dataset})
    with pytest.raises(SourceError, match="as_of_at is null"):
        run_readiness(bq_client, sql)


def test_freshness_is_computed_from_as_of_at():
    r = Readiness("load-1", datetime(2026, 11, 1, tzinfo=UTC), True, None)
    assert freshness_problem(r, 180, datetime(2026, 11, 1, 2, 59, tzinfo=UTC)) is None
    problem = freshness_problem(r, 180, datetime(2026, 11, 1, 3, 1, tzinfo=UTC))
    assert "181 minutes old" in problem and "load-1" in problem


@pytest.fixture(scope="module")
def seeded(bq_client):
    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, 130)
    return dataset


def test_candidate_table_is_materialized_with_expiry_and_dropped(bq_client, seeded):
    loaded = make_config(seeded)
    table_id = candidate_table_id("nexus-test", f"ctl_{uuid.uuid4().hex[:6]}", "month_end_arr", "run/1:x", "e1")
    assert table_id.endswith("wb_candidates_month_end_arr_run_1_x_e1")
    assert table_id != candidate_table_id("nexus-test", table_id.split(".")[1], "month_end_arr", "run/1:x", "e2")
    table = materialize_candidates(bq_client, table_id, loaded.source_sql())
    assert table.row_count == 130
    assert MonthEndArrMapper.schema_problems(table.schema) == []
    expires = candidate_expiry(bq_client, table_id)
    now = datetime.now(UTC)
    assert expires is not None and now < expires <= now + CANDIDATE_TTL + timedelta(minutes=1)
    drop_candidates(bq_client, table_id)
    drop_candidates(bq_client, table_id)  # idempotent
    assert table_id.split(".")[-1] not in [t.table_id for t in bq_client.list_tables(table_id.rsplit(".", 1)[0])]


def test_candidate_table_with_external_ids_holds_only_those(bq_client, seeded):
    loaded = make_config(seeded)
    table_id = candidate_table_id("nexus-test", "ctl_canary", "month_end_arr", uuid.uuid4().hex, "e1")
    ids = ["001000000000001:2025-02", "001000000000003:2025-05", "not-there"]
    table = materialize_candidates(bq_client, table_id, loaded.source_sql(), external_ids=ids)
    assert table.row_count == 2
    rows = [r for page in iter_candidate_pages(bq_client, table_id) for r in page]
    assert [r["_outbound_external_id"] for r in rows] == sorted(ids[:2])
    drop_candidates(bq_client, table_id)


def test_pages_are_in_stable_external_id_order(bq_client, seeded):
    loaded = make_config(seeded)
    table_id = candidate_table_id("nexus-test", "ctl_pages", "month_end_arr", uuid.uuid4().hex, "e1")
    materialize_candidates(bq_client, table_id, loaded.source_sql())
    pages = list(iter_candidate_pages(bq_client, table_id, page_size=50))
    assert [len(p) for p in pages] == [50, 50, 30]
    ids = [r["_outbound_external_id"] for p in pages for r in p]
    assert ids == sorted(ids) and len(set(ids)) == 130
    again = [r["_outbound_external_id"] for p in iter_candidate_pages(bq_client, table_id, page_size=7) for r in p]
    assert again == ids
    drop_candidates(bq_client, table_id)


def _rows_by_id(reader: CandidateReader, page_size: int = 1000) -> dict:
    return {r["_outbound_external_id"]: r for page in reader.pages(page_size) for r in page}


def test_the_storage_read_api_reads_the_rows_and_payload_hashes_the_queries_read(bq_client, bq_storage, seeded):
    table_id = candidate_table_id("nexus-test", "ctl_arrow", "month_end_arr", uuid.uuid4().hex, "e1")
    materialize_candidates(bq_client, table_id, make_config(seeded).source_sql())
    arrow = CandidateReader(bq_client, table_id, storage=bq_storage)
    pages = list(arrow.pages(50))
    assert arrow.path == "storage_read_api" and arrow.refused is None
    assert all(0 < len(p) <= 50 for p in pages) and sum(map(len, pages)) == 130
    by_arrow, by_query = _rows_by_id(arrow), _rows_by_id(CandidateReader(bq_client, table_id))
    assert by_arrow == by_query and len(by_arrow) == 130
    mapper = MonthEndArrMapper()
    assert ({k: mapper.map_record(r).payload_hash for k, r in by_arrow.items()}
            == {k: mapper.map_record(r).payload_hash for k, r in by_query.items()})
    drop_candidates(bq_client, table_id)


def _read_both_ways(bq_client, bq_storage, rows_sql: str) -> dict:
    """The rows of a table made of `rows_sql` (STRUCTs), read with the Storage Read API, once
    checked equal to the query pages' reading of them."""
    dataset = f"cand_{uuid.uuid4().hex[:6]}"
    bq_client.create_dataset(dataset)
    table_id = f"nexus-test.{dataset}.cand"
    bq_client.query(f"CREATE TABLE `{table_id}` AS SELECT * FROM UNNEST([{rows_sql}])").result()
    by_arrow = _rows_by_id(CandidateReader(bq_client, table_id, storage=bq_storage))
    assert by_arrow == _rows_by_id(CandidateReader(bq_client, table_id))
    return by_arrow


def test_the_storage_read_api_reads_every_column_type_as_the_queries_do(bq_client, bq_storage):
    by_arrow = _read_both_ways(bq_client, bq_storage, (
        "STRUCT('a' AS _outbound_external_id, 42 AS i, 1.5 AS f, TRUE AS b, NUMERIC '123456.123456789' AS n, "
        "DATE '2025-02-01' AS d, TIMESTAMP '2025-02-01 10:11:12.345+00' AS ts, "
        "DATETIME '2025-02-01 10:11:12' AS dt, b'raw' AS raw), "
        "STRUCT('b', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"))
    assert by_arrow["a"]["ts"] == datetime(2025, 2, 1, 10, 11, 12, 345000, tzinfo=UTC)
    assert set(by_arrow["b"].values()) == {"b", None}


def test_the_storage_read_api_gives_timestamps_in_utc_and_dates_across_bigquerys_range_as_the_queries_do(
        bq_client, bq_storage):
    by_arrow = _read_both_ways(bq_client, bq_storage, (
        "STRUCT('min' AS _outbound_external_id, TIMESTAMP '0001-01-01 00:00:00+00' AS ts, DATE '0001-01-01' AS d), "
        "STRUCT('before_epoch', TIMESTAMP '1969-12-31 23:59:59.999999+00', DATE '1969-12-31'), "
        "STRUCT('epoch', TIMESTAMP '1970-01-01 00:00:00+00', DATE '1970-01-01'), "
        "STRUCT('offset', TIMESTAMP '2025-02-01 12:11:12.345+02', DATE '2024-02-29'), "
        "STRUCT('max', TIMESTAMP '9999-12-31 23:59:59.999999+00', DATE '9999-12-31'), STRUCT('null', NULL, NULL)"))
    assert {k: (r["ts"], r["d"]) for k, r in by_arrow.items()} == {
        "min": (datetime(1, 1, 1, tzinfo=UTC), date(1, 1, 1)),
        "before_epoch": (datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), date(1969, 12, 31)),
        "epoch": (datetime(1970, 1, 1, tzinfo=UTC), date(1970, 1, 1)),
        "offset": (datetime(2025, 2, 1, 10, 11, 12, 345000, tzinfo=UTC), date(2024, 2, 29)),
        "max": (datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), date(9999, 12, 31)),
        "null": (None, None),
    }
    # in UTC itself, as the query pages give them: the mapper formats them without converting
    assert all(r["ts"].tzinfo is UTC for k, r in by_arrow.items() if k != "null")


def test_an_empty_candidate_table_read_with_the_storage_read_api_has_no_pages(bq_client, bq_storage, seeded):
    table_id = candidate_table_id("nexus-test", "ctl_arrow", "month_end_arr", uuid.uuid4().hex, "e1")
    materialize_candidates(bq_client, table_id, make_config(seeded).source_sql(), external_ids=["not-there"])
    reader = CandidateReader(bq_client, table_id, storage=bq_storage)
    assert list(reader.pages(50)) == [] and reader.refused is None
    drop_candidates(bq_client, table_id)


def test_a_refused_storage_read_api_falls_back_to_query_pages_and_names_the_role(bq_client, refusing_storage,
                                                                               seeded):
    table_id = candidate_table_id("nexus-test", "ctl_refused", "month_end_arr", uuid.uuid4().hex, "e1")
    materialize_candidates(bq_client, table_id, make_config(seeded).source_sql())
    reader = CandidateReader(bq_client, table_id, storage=refusing_storage)
    ids = [r["_outbound_external_id"] for page in reader.pages(50) for r in page]
    assert ids == sorted(ids) and len(ids) == 130  # the query pages, in key order
    assert reader.path == "query_pages"
    assert "bigquery.readsessions.create" in reader.refused and "roles/bigquery.readSessionUser" in reader.refused
    assert "\n" not in reader.refused
    drop_candidates(bq_client, table_id)


@pytest.mark.slow
def test_a_storage_read_response_over_grpcs_default_4_mib_message_cap_is_read(bq_client, bq_storage):
    dataset = f"src_{uuid.uuid4().hex[:8]}"
    seed_source(bq_client, dataset, 100_000)
    table_id = candidate_table_id("nexus-test", "ctl_large", "month_end_arr", uuid.uuid4().hex, "e1")
    materialize_candidates(bq_client, table_id, make_config(dataset).source_sql())
    reader = CandidateReader(bq_client, table_id, storage=bq_storage)
    # The emulator sends it as messages of up to 65,536 rows (~6.6 MB here).
    assert sum(len(page) for page in reader.pages(5000)) == 100_000
    drop_candidates(bq_client, table_id)


def test_the_storage_read_client_for_real_bigquery_uses_the_warehouse_clients_credentials():
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import bigquery
    from google.cloud.bigquery_storage_v1 import BigQueryReadClient

    credentials = AnonymousCredentials()
    bq = bigquery.Client(project="nexus-prod", credentials=credentials)
    with storage_read_client(bq) as storage:
        assert isinstance(storage, BigQueryReadClient)
        assert storage.api_endpoint == "bigquerystorage.googleapis.com"
        assert storage.transport._credentials is credentials
    with storage_read_client(bq, enabled=False) as storage:
        assert storage is None


def test_null_and_duplicate_keys_are_found_with_set_queries(bq_client):
    dataset = f"keys_{uuid.uuid4().hex[:6]}"
    bq_client.create_dataset(dataset)
    table_id = f"nexus-test.{dataset}.cand"
    bq_client.query(
        f"CREATE TABLE `{table_id}` AS SELECT * FROM UNNEST(["
        "STRUCT('a' AS _outbound_external_id), STRUCT('b'), STRUCT('b'), STRUCT(CAST(NULL AS STRING)), "
        "STRUCT(''), STRUCT('c'), STRUCT('c'), STRUCT('c')])").result()
    report = check_keys(bq_client, table_id)
    assert report.rows == 8 and report.null_or_empty == 2
    assert report.duplicate_ids == 2 and report.duplicate_samples == ("b", "c")
    clean = f"nexus-test.{dataset}.clean"
    bq_client.query(f"CREATE TABLE `{clean}` AS SELECT x AS _outbound_external_id FROM UNNEST(['a','b']) AS x").result()
    assert check_keys(bq_client, clean).duplicate_ids == 0
