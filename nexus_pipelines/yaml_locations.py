"""YAML files that can say where a bad key or value is: the parsed data plus the line and
column of every key and value, so a config error names the line to fix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

KeyPath = tuple[str | int, ...]


class YamlSyntaxError(ValueError):
    """The text is not YAML; the message names the line and column where parsing stopped."""


@dataclass(frozen=True)
class Located:
    """Parsed YAML and where each path's key and value start (1-based line and column)."""

    data: Any
    keys: dict[KeyPath, tuple[int, int]] = field(default_factory=dict)
    values: dict[KeyPath, tuple[int, int]] = field(default_factory=dict)

    def where(self, path: Sequence[Any], *, key: bool = False) -> str:
        """`line L, column C` of the path's key (or value), else of its nearest located parent
        (a missing key is reported at the mapping that lacks it); '' when nothing is located."""
        path = tuple(path)
        for end in range(len(path), -1, -1):
            found = (self.keys if key and end == len(path) else self.values).get(path[:end])
            if found:
                return f"line {found[0]}, column {found[1]}"
        return ""


def load(text: str) -> Located:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise YamlSyntaxError(f"not valid YAML{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(f"not valid YAML ({type(exc).__name__})") from None
    finally:
        loader.dispose()
    located = Located(data)
    if node is not None:
        _walk(node, (), located)
    return located


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _walk(node: yaml.Node, path: KeyPath, located: Located) -> None:
    located.values[path] = _mark(node)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = (*path, key_node.value) if isinstance(key_node, yaml.ScalarNode) else path
            located.keys[child] = _mark(key_node)
            _walk(value_node, child, located)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, (*path, index), located)
