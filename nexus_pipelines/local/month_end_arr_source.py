"""Demo source tables of the Month End ARR writeback in a BigQuery dataset, generated in SQL
(fast on the emulator and on BigQuery): used by the demo, the benchmark and the tests."""

from __future__ import annotations

from google.cloud import bigquery

_GENERATE = """
CREATE OR REPLACE TABLE `{dataset}.month_end_arr` AS
SELECT CONCAT('001', LPAD(CAST(DIV(i, 12) AS STRING), 12, '0')) AS account_id,
       DATE_ADD(DATE '2025-01-01', INTERVAL MOD(i, 12) MONTH) AS month_start,
       IF(@negative_every > 0 AND MOD(i, @negative_every) = @negative_every - 1,
          CAST(-1 * (CAST(i AS NUMERIC) * 12.5 + 0.25) AS NUMERIC),
          CAST(CAST(i AS NUMERIC) * 12.5 + 0.25 AS NUMERIC)) AS arr_amount,
       IF(MOD(i, 7) = 0, 'EUR', 'USD') AS currency_code,
       IF(MOD(i, 5) = 0, CAST(NULL AS STRING), 'Cloud') AS product_line,
       @updated_at AS updated_at,
       @load_run_id AS load_run_id
  FROM UNNEST(GENERATE_ARRAY(0, @n - 1)) AS i
"""

_RUNS = """
CREATE OR REPLACE TABLE `{dataset}.pipeline_runs` AS
SELECT @load_run_id AS run_id, 'month_end_arr' AS pipeline, @status AS status, @finished_at AS finished_at
"""


def seed_source(client: bigquery.Client, dataset: str, rows: int, *, negative_every: int = 0,
                load_run_id: str = "load-0001", status: str = "succeeded", finished_at=None) -> None:
    """`rows` source rows (12 months per account); every `negative_every`-th row has a
    negative ARR, which the CRM's validation rule rejects per record."""
    from datetime import UTC, datetime, timedelta

    finished_at = finished_at or datetime.now(UTC) - timedelta(minutes=5)
    client.create_dataset(dataset, exists_ok=True)
    params = [
        bigquery.ScalarQueryParameter("n", "INT64", rows),
        bigquery.ScalarQueryParameter("negative_every", "INT64", negative_every),
        bigquery.ScalarQueryParameter("updated_at", "TIMESTAMP", finished_at.replace(microsecond=0)),
        bigquery.ScalarQueryParameter("load_run_id", "STRING", load_run_id),
    ]
    client.query(_GENERATE.format(dataset=dataset), job_config=bigquery.QueryJobConfig(query_parameters=params)).result()
    mark_load(client, dataset, load_run_id=load_run_id, status=status, finished_at=finished_at)


def mark_load(client: bigquery.Client, dataset: str, *, load_run_id: str, status: str = "succeeded",
              finished_at=None) -> None:
    from datetime import UTC, datetime

    params = [
        bigquery.ScalarQueryParameter("load_run_id", "STRING", load_run_id),
        bigquery.ScalarQueryParameter("status", "STRING", status),
        bigquery.ScalarQueryParameter("finished_at", "TIMESTAMP", finished_at or datetime.now(UTC)),
    ]
    client.query(_RUNS.format(dataset=dataset), job_config=bigquery.QueryJobConfig(query_parameters=params)).result()
