-- Each execution of a writeback run keeps its own run row; the run id groups them. A
-- replay of a finished run id used to overwrite the first execution's row (its counts
-- reset to 0) while the attempts table kept that execution's evidence.
--
-- An execution whose control-plane session died (the database restarted, the process was
-- killed) cannot finish its row; the next execution of the job marks it 'abandoned'.
-- session_pid and session_started_at identify the execution's session in
-- pg_stat_activity, so a dead holder is told apart from a live one before its lease ends.
UPDATE outbound_runs SET execution_id = substr(md5(job_name || '/' || run_id), 1, 12) WHERE execution_id IS NULL;

ALTER TABLE outbound_runs
    ALTER COLUMN execution_id SET NOT NULL,
    DROP CONSTRAINT outbound_runs_pkey,
    ADD PRIMARY KEY (job_name, run_id, execution_id),
    DROP CONSTRAINT outbound_runs_status_check,
    ADD CONSTRAINT outbound_runs_status_check CHECK (status IN
        ('running', 'succeeded', 'completed_with_errors', 'failed', 'dry_run', 'skipped_already_running',
         'abandoned')),
    ADD COLUMN session_pid        integer,
    ADD COLUMN session_started_at timestamptz;

-- The execution that took a lease (by its token), and the older ones still marked running.
CREATE INDEX outbound_runs_lease_token ON outbound_runs (job_name, lease_token);
