"""Atlassian Document Format as the Jira simulator checks it: the node types and shapes of
Atlassian's ADF schema that comments use, refused with a 400 when anything else arrives.

`check` validates a document and returns its visible text (blocks on their own lines), which
is what the simulator's tests and harness read back; `document` builds a plain document
(one paragraph per line) for comments and descriptions the simulator itself creates.
"""

from __future__ import annotations

from typing import Any

MAX_TEXT_CHARS = 32_767  # Jira's default limit for a text field, comments included
_BLOCKS = {"paragraph", "heading", "bulletList", "orderedList", "listItem", "codeBlock", "blockquote", "rule",
           "panel"}
_INLINE = {"text", "hardBreak", "mention", "emoji", "inlineCard"}
_MARKS = {"strong", "em", "code", "strike", "underline", "link", "subsup", "textColor"}


class AdfInvalid(ValueError):
    pass


def document(text: str) -> dict[str, Any]:
    return {"type": "doc", "version": 1, "content": [
        {"type": "paragraph", "content": [{"type": "text", "text": line}] if line else []}
        for line in text.split("\n")]}


def check(doc: Any) -> str:
    if not isinstance(doc, dict) or doc.get("type") != "doc" or doc.get("version") != 1:
        raise AdfInvalid("the body must be an ADF document: {\"type\": \"doc\", \"version\": 1, ...}")
    text = "\n".join(_block(node) for node in _content(doc, required=True))
    if len(text) > MAX_TEXT_CHARS:
        raise AdfInvalid(f"The entered text is too long. It exceeds the allowed limit of {MAX_TEXT_CHARS:,} "
                         "characters.")
    return text


def _content(node: dict, *, required: bool = False) -> list:
    content = node.get("content")
    if content is None and not required:
        return []
    if not isinstance(content, list) or not all(isinstance(child, dict) for child in content):
        raise AdfInvalid(f"{node.get('type')}.content must be a list of nodes")
    return content


def _block(node: dict) -> str:
    kind = node.get("type")
    if kind not in _BLOCKS:
        raise AdfInvalid(f"{kind!r} is not a block node")
    if kind in ("paragraph", "heading", "codeBlock"):
        return "".join(_inline(child) for child in _content(node))
    return "\n".join(_block(child) for child in _content(node))


def _inline(node: dict) -> str:
    kind = node.get("type")
    if kind not in _INLINE:
        raise AdfInvalid(f"{kind!r} is not an inline node")
    attrs = node.get("attrs") or {}
    if kind == "text":
        text, marks = node.get("text"), node.get("marks", [])
        if not isinstance(text, str) or not text:
            raise AdfInvalid("a text node needs a non-empty text")
        if not isinstance(marks, list) or any(not isinstance(m, dict) or m.get("type") not in _MARKS for m in marks):
            raise AdfInvalid("a text node has an unknown mark")
        return text
    if kind == "hardBreak":
        return "\n"
    if kind == "mention":
        return str(attrs.get("text", ""))
    if kind == "emoji":
        return str(attrs.get("text") or attrs.get("shortName", ""))
    return str(attrs.get("url", ""))
