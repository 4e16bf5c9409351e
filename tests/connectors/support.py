"""Provider-neutral checks for connector tests on the real control plane: the tickets and
facts a registration's round trip wrote, and every text a secret could leak into."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import Connection

from nexus_pipelines.connectors.core import store
from nexus_pipelines.connectors.core.registration import Registration
from nexus_pipelines.connectors.core.tick import PollRunReport
from nexus_pipelines.local.worlds.gitlab import GitLabWorld
from nexus_pipelines.local.worlds.plant import Plant


def tickets_by_ref(conn: Connection, registration: Registration) -> dict[str, dict]:
    rows = conn.execute(
        """SELECT l.external_ref, t.ticket_id, t.title, t.status, t.triage_state, t.priority, t.version,
                  t.source_state, (SELECT count(*) FROM ticket_observations o WHERE o.ticket_id = t.ticket_id)
             FROM ticket_custody_links l JOIN tickets t USING (ticket_id)
            WHERE l.tenant = %s AND l.registration_key = %s""",
        (registration.tenant, registration.key),
    ).fetchall()
    keys = ("ticket_id", "title", "status", "triage_state", "priority", "version", "source_state", "observations")
    return {r[0]: dict(zip(keys, r[1:])) for r in rows}


def counts(conn: Connection, registration: Registration) -> dict[str, int]:
    """Row counts of every fact a round trip writes, scoped to one registration."""
    rid = registration.registration_id
    params = (registration.tenant, registration.key)
    one = lambda sql, args=params: conn.execute(sql, args).fetchone()[0]  # noqa: E731
    return {
        "tickets": one("SELECT count(*) FROM ticket_custody_links WHERE tenant = %s AND registration_key = %s"),
        "observations": one("""SELECT count(*) FROM ticket_observations o JOIN ticket_custody_links l USING (ticket_id)
                               WHERE l.tenant = %s AND l.registration_key = %s"""),
        "priority_facts": one("""SELECT count(*) FROM ticket_priority_facts f JOIN ticket_custody_links l USING (ticket_id)
                                 WHERE l.tenant = %s AND l.registration_key = %s"""),
        "commands": one("SELECT count(*) FROM ticket_close_commands WHERE tenant = %s AND registration_key = %s"),
        "receipts": one("""SELECT count(*) FROM ticket_close_receipts r JOIN ticket_close_commands c USING (command_id)
                           WHERE c.tenant = %s AND c.registration_key = %s"""),
        "ingress_receipts": one("SELECT count(*) FROM ingress_receipts WHERE registration_id = %s", (rid,)),
        "work_items": one("SELECT count(*) FROM connector_work_items WHERE registration_id = %s", (rid,)),
    }


def all_control_text(conn) -> str:
    """Every text, json and array value of every table in the control schema, as one string."""
    columns = conn.execute(
        """SELECT table_name, column_name FROM information_schema.columns
            WHERE table_schema = current_schema() AND data_type IN ('text', 'jsonb', 'json', 'ARRAY',
                                                                    'character varying')""").fetchall()
    parts = []
    for table, column in columns:
        rows = conn.execute(f'SELECT "{column}"::text FROM "{table}" WHERE "{column}" IS NOT NULL').fetchall()
        parts.extend(r[0] for r in rows)
    return "\n".join(parts)


def everything_recorded(plant: Plant, registration: Registration, reports: Sequence[PollRunReport], log_text: str) -> str:
    """Every text a secret could leak into: logs, the composed adapter's repr, the poll ticks,
    every control-plane table and the registration's cursor tokens, as one string."""
    texts = [log_text, repr(plant.composer(registration))]
    texts += [str(tick.as_dict()) for report in reports for tick in report.ticks]
    with plant.pool.connection() as conn:
        texts.append(all_control_text(conn))
        texts.extend(v.cursor or "" for v in store.progress(conn, [registration.registration_id]))
    return "\n".join(texts)


def expired_claim(conn: Connection, registration: Registration) -> store.PollClaim:
    """A poll claim taken by a slow poller whose lease has since run out (by the database clock)."""
    from datetime import timedelta

    from nexus_pipelines.connectors.registry import REGISTRY

    stale = store.claim_due(conn, REGISTRY, owner="slow", ttl=timedelta(seconds=60),
                            registration_ids=[registration.registration_id])
    conn.execute("UPDATE connector_progress SET lease_until = now() - interval '1 second'"
                 " WHERE registration_key = %s", (registration.key,))
    return stale


def due_gitlab_poll(pool, key: str, issues: int, page_size: int = 4) -> tuple[Plant, Registration]:
    """A GitLab registration read `page_size` issues a page, holding `issues` issues, its poll due now."""
    plant = Plant(GitLabWorld(), pool)
    registration = plant.world.registration(key=key, page_size=page_size)
    plant.activate(registration)
    plant.world.add_issues(issues)
    with pool.connection() as conn:
        store.request_poll(conn, [registration.registration_id])
    return plant, registration
