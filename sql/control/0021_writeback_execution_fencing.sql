-- Each writeback execution has its own fencing identity (issue 12 item 6): a replay with
-- the run id of a live execution is refused instead of taking over its lease, and the
-- run row is written only by the execution that holds it. The lease owner is
-- '<run_id>@<execution_id>'; the view keeps showing the run id as owner_run_id.
-- crm_api_usage is the last Sforce-Limit-Info api-usage the CRM reported ('N/M').
ALTER TABLE outbound_runs
    ADD COLUMN execution_id  text,
    ADD COLUMN crm_api_usage text;

CREATE OR REPLACE VIEW outbound_job_leases AS
SELECT substr(lease_name, length('writeback:') + 1)      AS job_name,
       regexp_replace(owner_id, '@[0-9a-f]{12}$', '')     AS owner_run_id,
       acquired_at,
       heartbeat_at,
       expires_at,
       fencing_token,
       substring(owner_id from '@([0-9a-f]{12})$')       AS owner_execution_id
  FROM leases
 WHERE lease_name LIKE 'writeback:%';
