"""GitHub close-back: one marker-bearing comment, then `PATCH state=closed,
state_reason=completed`, each ambiguous step reconciled before anything retryable is
answered (docs/design/connector-contract.md, "Marker reconciliation"): the comment by
listing every page of the issue's comments for the exact marker, the close by reading
the issue's state (each read asked again on a 5xx). A lookup that cannot tell gives
`AmbiguousWrite`, which core never retries in the same request.
"""

from __future__ import annotations

from typing import Protocol

import httpx
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from nexus_pipelines.connectors.core.values import (
    CloseExternalIssue,
    CloseExternalIssueResult,
    ConnectorReceipt,
)
from nexus_pipelines.connectors.provider_http import (
    Deadline,
    MarkerLookup,
    Problem,
    after_close_write,
    after_comment_write,
    close_receipt,
    earlier_comment,
    next_link,
)
from nexus_pipelines.integrations.http import origin_of

MAX_COMMENT_PAGES = 30  # a marker lookup reads at most 3,000 comments before it calls itself inconclusive
CLOSE_BODY = {"state": "closed", "state_reason": "completed"}

_RAW = ConfigDict(extra="ignore", frozen=True, strict=True)


class _Comment(BaseModel):
    model_config = _RAW
    id: int
    body: str | None


class _State(BaseModel):
    model_config = _RAW
    state: str


_COMMENTS = TypeAdapter(list[_Comment])


class _Connector(Protocol):
    def send(self, method: str, url: str, deadline: Deadline, endpoint: str,
             **kwargs) -> httpx.Response | Problem: ...

    def classify(self, response: httpx.Response, what: str) -> Problem: ...


def _closed(response: httpx.Response) -> bool | None:
    try:
        return _State.model_validate_json(response.content).state == "closed"
    except ValidationError:
        return None


class CloseBack:
    """One invocation of comment-and-close for one issue URL."""

    def __init__(self, connector: _Connector, command: CloseExternalIssue, issue_url: str,
                 deadline: Deadline) -> None:
        self._connector = connector
        self._command = command
        self._url = issue_url
        self._deadline = deadline

    def run(self) -> CloseExternalIssueResult:
        comment_id, failure = earlier_comment(self._command, self._find_marker)
        if failure is not None:
            return failure
        if comment_id is None:
            comment_id, failure = self._post_comment()
            if failure is not None:
                return failure
        return self._close(comment_id)

    def _send(self, method: str, url: str, endpoint: str, **kwargs) -> httpx.Response | Problem:
        return self._connector.send(method, url, self._deadline, endpoint, **kwargs)

    def _post_comment(self) -> tuple[str | None, CloseExternalIssueResult | None]:
        response = self._send("POST", f"{self._url}/comments", "create_comment", json={"body": self._command.comment})
        problem = response if isinstance(response, Problem) else None
        if problem is None and response.status_code == 201:
            try:
                return str(_Comment.model_validate_json(response.content).id), None
            except ValidationError:
                problem = Problem("retryable", "transport_protocol", "creating the comment: the answer does not "
                                  "parse", maybe_written=True)
        return after_comment_write(problem or self._connector.classify(response, "creating the comment"),
                                   self._find_marker)

    def _close(self, comment_id: str) -> CloseExternalIssueResult:
        response = self._send("PATCH", self._url, "update_issue", json=CLOSE_BODY)
        problem = response if isinstance(response, Problem) else None
        if problem is None and response.status_code == 200:
            if _closed(response):
                return self._receipt(comment_id)
            problem = Problem("retryable", "transport_protocol", "closing the issue: the answer does not show it "
                              "closed", maybe_written=True)
        if problem is None:
            problem = self._connector.classify(response, "closing the issue")
        return after_close_write(problem, self._read_closed, lambda: self._receipt(comment_id))

    def _read_closed(self) -> bool | Problem:
        state = self._send("GET", self._url, "get_issue")
        if isinstance(state, Problem):
            return state
        if state.status_code != 200:
            return self._connector.classify(state, "reading the issue")
        closed = _closed(state)
        if closed is None:
            return Problem("retryable", "transport_protocol", "reading the issue: the answer does not parse")
        return closed

    def _receipt(self, comment_id: str) -> ConnectorReceipt:
        return close_receipt(self._command, f"comment:{comment_id}")

    def _find_marker(self) -> MarkerLookup:
        """Every page of the issue's comments, for the exact marker: found, absent (problem None),
        or inconclusive."""
        url, params, origin = f"{self._url}/comments", {"per_page": 100}, origin_of(self._url)
        for _ in range(MAX_COMMENT_PAGES):
            response = self._send("GET", url, "list_comments", params=params)
            if isinstance(response, Problem):
                return MarkerLookup(problem=response)
            if response.status_code != 200:
                return MarkerLookup(problem=self._connector.classify(response, "reading comments"))
            try:
                comments = _COMMENTS.validate_json(response.content)
            except ValidationError:
                return MarkerLookup(problem=Problem("retryable", "transport_protocol", "reading comments: the body does "
                                               "not parse"))
            for comment in comments:
                if comment.body is not None and self._command.marker in comment.body:
                    return MarkerLookup(found=str(comment.id))
            link = next_link(response)
            if link is None:
                return MarkerLookup()
            if origin_of(link) != origin:
                return MarkerLookup(problem=Problem("terminal", "invalid_payload", "a comments link points elsewhere"))
            url, params = link, None
        return MarkerLookup(problem=Problem("retryable", "provider_5xx", f"reading comments: more than "
                                       f"{MAX_COMMENT_PAGES} pages"))
