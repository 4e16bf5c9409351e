"""Raw baseline: one table, claim 100 rows per FOR UPDATE SKIP LOCKED statement, complete them with one more."""

from __future__ import annotations

import psycopg

CLAIM_BATCH = 100
OPTIONS = {"claim_batch": CLAIM_BATCH}

CLAIM = """
WITH c AS (
    SELECT id FROM raw_jobs WHERE NOT done AND locked_by IS NULL
    ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)
UPDATE raw_jobs r SET locked_by = %s FROM c WHERE r.id = c.id RETURNING r.id
"""
COMPLETE = "UPDATE raw_jobs SET done = true WHERE id = ANY(%s)"


def setup(dsn: str, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE raw_jobs (id bigserial PRIMARY KEY, done bool DEFAULT false, locked_by int)")
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
