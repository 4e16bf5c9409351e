-- Readiness of the Month End ARR source: the latest load of the finance mart, from
-- the authoritative pipeline_runs metadata (never CURRENT_TIMESTAMP()). A load still
-- in progress (no finished_at yet) is the latest one: it sorts first, so the source
-- reads as not ready while it is being reloaded.
SELECT
  r.run_id AS _outbound_source_run_id,
  r.finished_at AS _outbound_source_as_of_at,
  r.status = 'succeeded' AS _outbound_source_ready,
  IF(r.status = 'succeeded', CAST(NULL AS STRING), CONCAT('latest load ', r.run_id, ' is ', r.status)) AS _outbound_source_reason
FROM `${source_dataset}.pipeline_runs` AS r
WHERE r.pipeline = 'month_end_arr'
ORDER BY r.finished_at IS NULL DESC, r.finished_at DESC
LIMIT 1
