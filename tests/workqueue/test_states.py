"""The state lists of `states.py` are the ones the database enforces."""

from __future__ import annotations

import re

import pytest

from nexus_pipelines.workqueue import states

CHECKS = [
    ("connector_work_items", "connector_work_items_state_check", states.WORK_ITEM_STATES),
    ("event_executions", "event_executions_state_check", states.EXECUTION_STATES),
    ("workqueue_generations", "workqueue_generations_status_check", states.GENERATION_STATUSES),
    ("workqueue_generations", "workqueue_generations_claim_path_check", states.CLAIM_PATHS),
    ("workqueue_generation_receipts", "workqueue_generation_receipts_kind_check", states.RECEIPT_KINDS),
    ("legacy_outcome_receipts", "legacy_outcome_receipts_outcome_check", states.LEGACY_OUTCOMES),
]


def _literals(definition: str) -> set[str]:
    return set(re.findall(r"'([a-z_]+)'::text", definition))


@pytest.mark.parametrize("table, constraint, expected", CHECKS, ids=[c[1] for c in CHECKS])
def test_check_constraints_list_exactly_the_states_module(control_conn, table, constraint, expected):
    (definition,) = control_conn.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass AND conname = %s",
        (table, constraint),
    ).fetchone()
    assert _literals(definition) == set(expected)


@pytest.mark.parametrize("table, known", [("connector_work_items", states.WORK_ITEM_STATES),
                                          ("event_executions", states.EXECUTION_STATES)])
def test_partial_index_predicates_name_only_known_states(control_conn, table, known):
    predicates = [r[0] for r in control_conn.execute(
        "SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indrelid = %s::regclass AND indpred IS NOT NULL",
        (table,),
    )]
    assert predicates
    for predicate in predicates:
        assert _literals(predicate) <= set(known), predicate


def test_sql_in_quotes_each_value():
    assert states.sql_in(states.CLAIMABLE) == "('pending', 'retry')"
