"""The docs name only what exists: every repository path and every `nexus-pipelines` command in
the README and the connector-author guide resolves."""

from __future__ import annotations

import re

import click
import pytest

from nexus_pipelines.cli import main
from nexus_pipelines.settings import PROJECT_ROOT

DOCS = ("README.md", "docs/connectors/authoring.md")
_SPAN = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"^[\w.-]+(/[\w.<>-]+)+/?$")
_PLACEHOLDER = re.compile(r"acme|<|\.\.\.|NNNN")
_TOP = ("nexus_pipelines/", "tests/", "sql/", "configs/", "bench/", "docs/", ".ci/")


def spans(name: str) -> list[str]:
    text = (PROJECT_ROOT / name).read_text()
    blocks = re.findall(r"```\w*\n(.*?)```", text, re.S)
    return _SPAN.findall(re.sub(r"```\w*\n.*?```", "", text, flags=re.S)) + [
        line.strip() for block in blocks for line in block.splitlines()]


def paths(name: str) -> list[str]:
    found = set()
    for span in spans(name):
        for word in span.split():
            word = word.strip(",;:()").split(":")[0]
            if _PATH.match(word) and word.startswith(_TOP) and not _PLACEHOLDER.search(word):
                found.add(word)
    return sorted(found)


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_the_docs_name_exists(doc):
    missing = [p for p in paths(doc) if not (PROJECT_ROOT / p).exists()]
    assert paths(doc), doc
    assert missing == [], missing


def _resolves(words: list[str]) -> bool:
    command: click.Command = main
    for word in words:
        if not isinstance(command, click.Group):
            return True  # the rest are arguments and options
        if word.startswith(("-", "[")) or word.isupper() or "<" in word or word in ("...", "|"):
            return True
        sub = command.get_command(click.Context(command), word.split("|")[0])
        if sub is None:
            return False
        command = sub
    return True


@pytest.mark.parametrize("doc", DOCS)
def test_every_command_the_docs_name_exists(doc):
    commands = [s for s in spans(doc) if s.startswith("nexus-pipelines ")]
    assert commands, doc
    broken = [c for c in commands if not _resolves(c.replace("\\|", "|").split()[1:])]
    assert broken == [], broken
