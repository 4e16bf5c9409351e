-- Attempt evidence is appended a batch at a time, so the attempts of one run lie on
-- neighbouring pages. A btree on (job_name, run_id) added one index entry per attempt
-- row, a third of the btree writes of every batch commit; a block-range index finds a
-- run's pages from one summary per range and is written only when a range is summarized.
-- autosummarize: a range is summarized by autovacuum once it is full, so a lookup reads
-- only the ranges of its run (and the unsummarized last ones).
DROP INDEX outbound_record_attempts_run;
CREATE INDEX outbound_record_attempts_run ON outbound_record_attempts USING brin (job_name, run_id)
    WITH (autosummarize = on);
