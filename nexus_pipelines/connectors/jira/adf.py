"""Atlassian Document Format, the rich-text JSON of REST API v3 comments and descriptions.

`to_adf` writes plain text as a document (a blank line separates paragraphs, a line
break inside one is a `hardBreak`), and `to_text` reads any document back as plain
text, so a marker written by `to_adf` is found again, character for character, by
`to_text`. A node that is not an object with a string `type`, or a text node without a
string `text`, is refused (`AdfError`): the payload is not what Jira documents.
"""

from __future__ import annotations

from typing import Any

# Inline nodes whose visible text lives in an attribute rather than in a text node.
_ATTR_TEXT = {"mention": "text", "emoji": "text", "inlineCard": "url", "status": "text"}
_INLINE_KINDS = frozenset({"text", "hardBreak", *_ATTR_TEXT})


class AdfError(ValueError):
    pass


def to_adf(text: str) -> dict[str, Any]:
    paragraphs = []
    for block in text.split("\n\n"):
        content: list[dict[str, Any]] = []
        for n, line in enumerate(block.split("\n")):
            if n:
                content.append({"type": "hardBreak"})
            if line:
                content.append({"type": "text", "text": line})
        paragraphs.append({"type": "paragraph", "content": content})
    return {"type": "doc", "version": 1, "content": paragraphs}


def to_text(doc: Any) -> str:
    if not isinstance(doc, dict) or doc.get("type") != "doc":
        raise AdfError("the body is not an ADF document")
    return "\n\n".join(_inline(block) for block in _children(doc))


def _children(node: dict[str, Any]) -> list[dict[str, Any]]:
    content = node.get("content", [])
    if not isinstance(content, list):
        raise AdfError(f"a {node.get('type')} node has malformed content")
    for child in content:
        if not isinstance(child, dict) or not isinstance(child.get("type"), str):
            raise AdfError(f"a {node.get('type')} node has malformed content")
    return content


def _inline(node: dict[str, Any]) -> str:
    kind = node["type"]
    if kind == "text":
        if not isinstance(node.get("text"), str):
            raise AdfError("a text node has no text")
        return node["text"]
    if kind == "hardBreak":
        return "\n"
    if kind in _ATTR_TEXT:
        value = (node.get("attrs") or {}).get(_ATTR_TEXT[kind], "")
        return value if isinstance(value, str) else ""
    children = _children(node)
    # nested blocks (list items, table cells, panels) read one per line
    nested = any(child["type"] not in _INLINE_KINDS for child in children)
    return ("\n" if nested else "").join(_inline(child) for child in children)
