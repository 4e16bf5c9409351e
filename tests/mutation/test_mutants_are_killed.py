"""CI runs the mutation check: every removed guard makes the connector suites fail."""

import pytest

from tests.mutation.mutants import MUTANTS, run_mutant


@pytest.mark.slow
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_removing_the_guard_fails_the_suite(mutant):
    result = run_mutant(mutant)
    assert result["killed"], result
