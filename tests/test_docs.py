"""The docs name only what exists: every repository path, every `nexus-pipelines` command (each
alternative of `a|b|c`) and every option named for it in the README and the connector-author
guide resolves against the real click CLI."""

from __future__ import annotations

import re

import click
import pytest

from nexus_pipelines.cli import main
from nexus_pipelines.settings import PROJECT_ROOT

DOCS = ("README.md", "docs/connectors/authoring.md", "docs/design/writeback-run.md", "docs/design/work-queue.md",
        "docs/design/connector-contract.md", "docs/design/triage-authority.md")
_SPAN = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"^[\w.-]+(/[\w.<>-]+)+/?$")
_PLACEHOLDER = re.compile(r"acme|<|\.\.\.|NNNN")
_TOP = ("nexus_pipelines/", "tests/", "sql/", "configs/", "bench/", "docs/", ".ci/", "deploy/")


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


def commands(name: str) -> list[str]:
    """Every `nexus-pipelines ...` span of a doc, and in the CLI table the spans its first
    cell adds without the prefix (`nexus-pipelines queue dlq list` / `queue replay WORK_ID`)."""
    found = [s for s in spans(name) if s.startswith("nexus-pipelines ")]
    for line in (PROJECT_ROOT / name).read_text().splitlines():
        if line.startswith("| `nexus-pipelines "):
            first_cell = re.split(r"(?<!\\)\|", line)[1]
            found += [f"nexus-pipelines {s}" for s in _SPAN.findall(first_cell) if not s.startswith("nexus-pipelines ")]
    return found


def _is_argument(word: str) -> bool:
    return word.startswith(("-", "[")) or word.isupper() or "<" in word or word in ("...", "|")


def named_commands(words: list[str], command: click.Command = main, path: str = "nexus-pipelines"):
    """(path, click command or None when it does not exist, the words after it) for each
    command the words name: every alternative of `a|b|c`."""
    if isinstance(command, click.Group) and words and not _is_argument(words[0]):
        for name in words[0].split("|"):
            sub = command.get_command(click.Context(command), name)
            yield from named_commands(words[1:], sub, f"{path} {name}") if sub else [(f"{path} {name}", None, [])]
        return
    yield path, command, words


def unknown_options(command: click.Command, words: list[str]) -> list[str]:
    """The `--options` among `words` that `command` does not have."""
    known = {opt for param in command.get_params(click.Context(command)) for opt in (*param.opts, *param.secondary_opts)}
    return [opt for opt in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", " ".join(words)) if opt not in known]


def problems(span: str) -> list[str]:
    out = []
    for path, command, rest in named_commands(span.replace("\\|", "|").split()[1:]):
        if command is None:
            out.append(f"{path}: no such command")
        else:
            out += [f"{path}: no option {opt}" for opt in unknown_options(command, rest)]
    return out


def test_the_check_sees_every_alternative_and_every_option():
    assert problems("nexus-pipelines local up\\|status\\|down") == []
    assert problems("nexus-pipelines local up|stop|down") == ["nexus-pipelines local stop: no such command"]
    assert problems("nexus-pipelines writeback runs|records [--job J] [--retries N]") == [
        "nexus-pipelines writeback runs: no option --retries", "nexus-pipelines writeback records: no option --retries"]
    assert problems("nexus-pipelines queue fences [--registration REG]") == []  # a group's own option
    assert problems("nexus-pipelines connectors activate KEY ... | --every") == [
        "nexus-pipelines connectors activate: no option --every"]


@pytest.mark.parametrize("doc", DOCS)
def test_every_command_and_option_the_docs_name_exists(doc):
    assert commands(doc), doc
    broken = [problem for span in commands(doc) for problem in problems(span)]
    assert broken == [], broken
