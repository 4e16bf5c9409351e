"""Raw baseline with the queue's rules: plain SQL that keeps nexus's lane and fencing rules.

The same workload as the nexus driver (its source lanes and crossing target lanes, the
same claim batch), on one table `lane_jobs` with the indexes the rules need, and none of
nexus's generations, queue classes, attempts, parking, heartbeat or handler pool. It is
not a lower bound (nexus's claim is tuned further: parked backlogs, a plan the server
keeps cached): it shows what the rules cost when written plainly, beside
`raw_skip_locked`, which keeps none of them. What it keeps:

* source lane FIFO: only a lane's head (its lowest pending id) is claimable, and at most
  one item of a lane runs (a unique index over the running rows);
* target mutation lane: at most one running item per lane (a unique index), and a claim
  takes at most one candidate per target lane;
* fencing: each claim gives its rows a token from a sequence and a lease deadline from the
  database clock, and the completion changes only rows still running under that token and
  lease.

Each worker loops on two autocommit statements per batch, claim and complete, like
`raw_skip_locked`; a claim holds its candidates and their target lanes with advisory
try-locks, as nexus's claim does (see CLAIM). A claim whose lane insert meets one another
claim just committed is refused by the unique index and claims again (a lost lane race),
and a statement that waits longer than the lock budget gives up and runs again (see
LOCK_BUDGET_MS). An empty claim while pending rows remain (every due lane head held by
another worker) waits the nexus driver's idle poll interval and claims again; the worker
stops once nothing is pending.
"""

from __future__ import annotations

import time

import psycopg
from psycopg import errors

from bench.peers.nexus_driver import CLAIM_BATCH, LANES, POLL_INTERVAL_S, target_lane

OPTIONS = {"claim_batch": CLAIM_BATCH, "source_lanes": LANES, "target_lanes": LANES, "fencing": "token + lease"}

# Candidates are held by an advisory try-lock each (a row lock would be taken on the newest
# version of a row another claim took since this one's snapshot, before the recheck drops it,
# and hold up that row's completion), one per target lane by a try-lock on the lane, and taken
# by compare-and-swap on their state.
CLAIM = """
WITH cand AS (
    SELECT f.id, f.target_lane FROM (
        SELECT j.id, j.target_lane FROM lane_jobs j
         WHERE j.state = 'pending'
           AND (SELECT h.id FROM lane_jobs h
                 WHERE h.source_lane = j.source_lane AND h.state = 'pending' ORDER BY h.id LIMIT 1) >= j.id
           AND NOT EXISTS (SELECT 1 FROM lane_jobs r WHERE r.source_lane = j.source_lane AND r.state = 'running')
           AND NOT EXISTS (SELECT 1 FROM lane_jobs t WHERE t.target_lane = j.target_lane AND t.state = 'running')
         ORDER BY j.id
        OFFSET 0) f
     WHERE pg_try_advisory_xact_lock(f.id)
     LIMIT %(limit)s),
pick AS (
    SELECT p.id FROM (SELECT DISTINCT ON (target_lane) id, target_lane FROM cand ORDER BY target_lane, id) p
     WHERE pg_try_advisory_xact_lock(1, hashtext(p.target_lane)))
UPDATE lane_jobs j
   SET state = 'running', owner = %(owner)s, token = nextval('lane_tokens'), lease_until = now() + interval '30 s'
  FROM pick
 WHERE j.id = pick.id AND j.state = 'pending'
RETURNING j.id, j.token
"""
COMPLETE = """
UPDATE lane_jobs j SET state = 'done', lease_until = NULL
  FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS d(id, token)
 WHERE j.id = d.id AND j.token = d.token AND j.state = 'running' AND j.lease_until > now()
"""
# A statement waits at most this long for a lock, and one that runs out (or meets a deadlock, or
# a lane another claim just took) wrote nothing and runs again, as nexus's claims and
# completions do: a claim that rechecks a row another claim took keeps a lock on its newest
# version, and the completion of that row then waits for the claim.
LOCK_BUDGET_MS = 50
RETRIED = (errors.UniqueViolation, errors.DeadlockDetected, errors.LockNotAvailable)
PENDING = "SELECT EXISTS (SELECT 1 FROM lane_jobs WHERE state = 'pending')"


def setup(dsn: str, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("""CREATE TABLE lane_jobs (
            id bigserial PRIMARY KEY, source_lane text NOT NULL, target_lane text NOT NULL,
            state text NOT NULL DEFAULT 'pending', owner int, token bigint, lease_until timestamptz)""")
        conn.execute("CREATE SEQUENCE lane_tokens")
        conn.execute("CREATE INDEX lane_jobs_due ON lane_jobs (id) WHERE state = 'pending'")
        conn.execute("CREATE INDEX lane_jobs_source_head ON lane_jobs (source_lane, id) WHERE state = 'pending'")
        conn.execute("CREATE UNIQUE INDEX lane_jobs_source_running ON lane_jobs (source_lane) WHERE state = 'running'")
        conn.execute("CREATE UNIQUE INDEX lane_jobs_target_running ON lane_jobs (target_lane) WHERE state = 'running'")
        with conn.cursor().copy("COPY lane_jobs (source_lane, target_lane) FROM STDIN") as copy:
            for i in range(n):
                copy.write_row((f"s{i % LANES}", target_lane(i)))
        conn.execute("VACUUM ANALYZE lane_jobs")


def run_worker(dsn: str, worker_index: int, n: int, start_event) -> list[int]:
    handled: list[int] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SET lock_timeout = {LOCK_BUDGET_MS}")
        claim, complete = conn.cursor(), conn.cursor()
        start_event.wait()
        while True:
            try:
                rows = claim.execute(CLAIM, {"limit": CLAIM_BATCH, "owner": worker_index}, prepare=True).fetchall()
            except RETRIED:
                continue  # lost a lane race: claim again
            if not rows:
                if not conn.execute(PENDING).fetchone()[0]:
                    return handled
                time.sleep(POLL_INTERVAL_S)
                continue
            ids = [r[0] for r in rows]
            handled.extend(ids)  # the no-op handler
            while True:
                try:
                    complete.execute(COMPLETE, {"ids": ids, "tokens": [r[1] for r in rows]}, prepare=True)
                    break
                except RETRIED:
                    pass  # one autocommit statement: it wrote nothing, run it again
            if complete.rowcount != len(ids):
                raise RuntimeError(f"worker {worker_index} lost {len(ids) - complete.rowcount} fenced items")


def verify(dsn: str, n: int) -> dict:
    with psycopg.connect(dsn) as conn:
        total, done, tokens = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE state = 'done'), count(DISTINCT token) FROM lane_jobs").fetchone()
    return {"rows": total, "done": done, "distinct_tokens": tokens,
            "queue_ok": total == n and done == n and tokens == n}
