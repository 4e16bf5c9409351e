-- What `provider_gates.recent_writes` holds, said where the schema can be read.
--
-- 0033 said it holds the writes of the last minute. The gate keeps every write inside the
-- longest window of the provider's write budget (GitHub's content budget counts a minute
-- and an hour), so a row holds up to an hour of write times; each admission drops the
-- older ones.
COMMENT ON COLUMN provider_gates.recent_writes IS
    'times of the writes admitted inside the longest window of the provider''s write budget '
    '(an hour for GitHub''s content budget); each admission drops the older ones';
