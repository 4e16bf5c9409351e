"""The mutation check: remove, one at a time, exact dedup, the proof-eligibility
check, the triage authority and expected-version checks, marker reconciliation and
fencing, and show that the suite fails for each.

Each mutant is a copy of the project with one guard replaced; the connector suites then
run against the copy (`python -m pytest` with the copy as working directory, so the
copy's package is imported). A mutant is killed when that run fails its tests.
Run directly (`python tests/mutation/mutants.py`) or through test_mutants_are_killed.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("tests/connectors/gitlab/test_acceptance.py", "tests/connectors/gitlab/test_conformance.py",
           "tests/tickets")


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str


MUTANTS = (
    Mutant("custody dedup", "nexus_pipelines/tickets/intake.py",
           "      FROM (SELECT * FROM given WHERE linked_id IS NULL ORDER BY idx) i\n",
           "      FROM (SELECT * FROM given ORDER BY idx) i\n"),
    Mutant("receipt dedup", "nexus_pipelines/workqueue/receipts.py",
           " ORDER BY d.ordinality\nON CONFLICT (registration_id, namespace, delivery_id) DO NOTHING\n",
           " ORDER BY d.ordinality\n"),
    Mutant("proof eligibility", "nexus_pipelines/tickets/proofs.py",
           'if triage != "ACCEPTED" or status == "cancelled":', "if False:"),
    Mutant("triage and priority authority", "nexus_pipelines/tickets/authority.py",
           "    if role not in MAY[action]:", "    if False:"),
    Mutant("expected-version check", "nexus_pipelines/tickets/commands.py",
           "            if ticket.version != expected_version:", "            if False:"),
    Mutant("marker reconciliation after an ambiguous write", "nexus_pipelines/connectors/provider_http.py",
           "    if not problem.maybe_written:\n        return None, close_failure(problem)",
           "    if True:\n        return None, close_failure(problem)"),
    Mutant("marker reconciliation before a repeated dispatch", "nexus_pipelines/connectors/provider_http.py",
           "    if not command.reconcile_first:\n        return None, None",
           "    if True:\n        return None, None"),
    Mutant("poll fencing", "nexus_pipelines/connectors/core/store.py",
           "SELECT coalesce((SELECT true FROM advanced), connector_poll_lease_lost(%(lost)s))", "SELECT true"),
    Mutant("work item fencing", "nexus_pipelines/tickets/handlers.py",
           "for n, item, observation in valid if item.fence in held]", "for n, item, observation in valid]"),
)


def _copy_project(target: Path) -> None:
    for name in ("nexus_pipelines", "tests", "sql", "configs", "deploy"):
        shutil.copytree(ROOT / name, target / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "workspace.yaml"):
        shutil.copy(ROOT / name, target / name)


def run_mutant(mutant: Mutant) -> dict:
    with tempfile.TemporaryDirectory(prefix="nexus-mutant-") as folder:
        copy = Path(folder)
        _copy_project(copy)
        source = copy / mutant.path
        text = source.read_text()
        if text.count(mutant.old) != 1:
            return {"mutant": mutant.name, "killed": False, "why": "the guard to remove was not found exactly once"}
        source.write_text(text.replace(mutant.old, mutant.new))
        # A basetemp of its own: a default one makes pytest chmod /tmp/pytest-of-<user> back to 0700, which
        # locks the running suite's embedded Postgres (another user) out of its data folder.
        result = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                 f"--basetemp={copy / '.pytest-tmp'}", *TARGETS],
                                cwd=copy, capture_output=True, text=True, timeout=600)
        tail = (result.stdout.strip().splitlines()[-1:] or [""])[0]
        # a failed test kills the mutant; errors (setup, collection, a server that died) prove nothing
        killed = result.returncode == 1 and " failed" in f" {tail}" and " error" not in tail
        return {"mutant": mutant.name, "killed": killed, "exit": result.returncode, "why": tail}


def main() -> int:
    results = [run_mutant(m) for m in MUTANTS]
    for result in results:
        print(json.dumps(result))
    return 0 if all(r["killed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
