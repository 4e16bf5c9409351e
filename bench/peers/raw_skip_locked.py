"""Raw baseline: the least a SKIP LOCKED queue does, with no fencing, lanes, leases or retries.

One table `raw_jobs (id, done, locked_by)` and a partial index on the unfinished rows'
ids, so a claim reads only unfinished rows (without it every claim would walk the
finished rows from the front of the primary key, and the baseline would slow down as
it drains). Each worker loops on two autocommit statements per batch:

* claim: the 100 lowest unfinished, unclaimed ids, `FOR UPDATE SKIP LOCKED`, marked
  with the worker's number in the same statement (`UPDATE ... FROM` the locked rows);
* complete: one `UPDATE ... SET done = true WHERE id = ANY(ids)` for the whole batch.

It stops on its first empty claim.
"""

from __future__ import annotations

import psycopg

CLAIM_BATCH = 100
OPTIONS = {"claim_batch": CLAIM_BATCH, "index": "partial (id) WHERE NOT done"}

CLAIM = """
WITH c AS (
    SELECT id FROM raw_jobs WHERE NOT done AND locked_by IS NULL
    ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)
UPDATE raw_jobs r SET locked_by = %s FROM c WHERE r.id = c.id RETURNING r.id
"""
COMPLETE = "UPDATE raw_jobs SET done = true WHERE id = ANY(%s)"


def setup(dsn: str, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE raw_jobs (id bigserial PRIMARY KEY, done bool NOT NULL DEFAULT false, locked_by int)")
        conn.execute("CREATE INDEX raw_jobs_unfinished ON raw_jobs (id) WHERE NOT done")
        conn.execute("INSERT INTO raw_jobs (done) SELECT false FROM generate_series(1, %s)", (n,))
        conn.execute("VACUUM ANALYZE raw_jobs")


def run_worker(dsn: str, worker_index: int, n: int, start_event) -> list[int]:
    handled: list[int] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        claim, complete = conn.cursor(), conn.cursor()
        start_event.wait()
        while True:
            ids = [row[0] for row in claim.execute(CLAIM, (CLAIM_BATCH, worker_index), prepare=True)]
            if not ids:
                return handled
            handled.extend(ids)  # the no-op handler
            complete.execute(COMPLETE, (ids,), prepare=True)


def verify(dsn: str, n: int) -> dict:
    with psycopg.connect(dsn) as conn:
        total, done = conn.execute("SELECT count(*), count(*) FILTER (WHERE done) FROM raw_jobs").fetchone()
    return {"rows": total, "done": done, "queue_ok": total == n and done == n}
