"""The domain packages import each other in one direction only: no cycle between them (for
example tickets use the connector contract, and connectors never import tickets). The
composition roots that join the domains (`definitions.py`, `bindings.py`, the CLI entry
point) are outside the graph; every import statement counts, module level or not. Neither
the package nor the benchmarks import the tests: what both drive lives in the package."""

from __future__ import annotations

import ast
from pathlib import Path

import nexus_pipelines

PACKAGE = Path(nexus_pipelines.__file__).parent
COMPOSITION_ROOTS = frozenset({"definitions", "bindings", "cli", "cli_common"})


def _unit(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "nexus_pipelines" and len(parts) > 1 else None


def _module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


def _imports(path: Path, *, absolute_only: bool = False) -> set[str]:
    here = [] if absolute_only else _module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not (absolute_only and node.level):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return found


def domain_graph() -> dict[str, set[str]]:
    """Top-level unit of nexus_pipelines -> the units its modules import (roots left out)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        source = _unit(_module_name(path))
        if source is None or source in COMPOSITION_ROOTS:
            continue
        targets = {_unit(m) for m in _imports(path)} - {None, source, *COMPOSITION_ROOTS}
        graph.setdefault(source, set()).update(t for t in targets if (PACKAGE / t).exists()
                                               or (PACKAGE / f"{t}.py").exists())
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import path that comes back to where it started (one per strongly connected group)."""
    found, seen = [], set()
    for start in sorted(graph):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for target in sorted(graph.get(node, ())):
                if target == start:
                    key = frozenset(path)
                    if key not in seen:
                        seen.add(key)
                        found.append([*path, start])
                elif target not in path:
                    stack.append((target, [*path, target]))
    return found


def test_the_domain_packages_import_each_other_without_a_cycle():
    assert cycles(domain_graph()) == []


def test_tickets_use_the_connector_contract_and_connectors_never_import_tickets():
    graph = domain_graph()
    assert "connectors" in graph["tickets"]
    assert "tickets" not in graph["connectors"]


def test_the_benchmarks_and_the_package_never_import_the_tests():
    sources = [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "bench").rglob("*.py")]
    importing = [str(p.relative_to(PACKAGE.parent)) for p in sources
                 if any(m == "tests" or m.startswith("tests.") for m in _imports(p, absolute_only=True))]
    assert importing == []


def test_the_cycle_finder_sees_a_cycle_through_a_third_package():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
