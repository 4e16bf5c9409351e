-- Month End ARR per account and month (one row per external ID).
-- ${source_dataset} is substituted from source.sql_vars in the job config.
SELECT
  CONCAT(a.account_id, ':', FORMAT_DATE('%Y-%m', a.month_start)) AS _outbound_external_id,
  CONCAT(a.load_run_id, '@', FORMAT_TIMESTAMP('%Y-%m-%dT%H:%M:%E6SZ', a.updated_at, 'UTC')) AS _outbound_source_version,
  a.updated_at AS _outbound_source_updated_at,
  a.account_id,
  a.month_start,
  a.arr_amount,
  a.currency_code,
  a.product_line
FROM `${source_dataset}.month_end_arr` AS a
