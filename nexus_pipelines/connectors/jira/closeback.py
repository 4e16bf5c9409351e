"""Jira close-back: find the transition to the configured done status, post one
marker-bearing ADF comment, then perform that transition (marker reconciliation,
docs/design/connector-contract.md).

Transition ids belong to a workflow (each work type can have its own) and what is
available depends on the issue's current status, so they are listed for the issue on
every close (`GET .../transitions`), never cached or configured. The issue's status is
read first: one in the done category is not transitioned again (Jira offers a global
transition to done even then). No transition to the done status from an open status means
this account cannot close the issue: a terminal failure before anything is written.

Each write whose outcome the transport cannot prove is reconciled before anything
retryable is answered: the comment by reading every page of the issue's comments for
the exact marker, the transition by reading the issue's status (each read asked again on a 5xx). A lookup that
cannot tell gives `AmbiguousWrite`, which core never retries in request.
"""

from __future__ import annotations

import httpx
from pydantic import BaseModel, ValidationError

from nexus_pipelines.connectors.core.values import (
    CloseExternalIssue,
    CloseExternalIssueResult,
    CloseFailure,
    ConnectorReceipt,
)
from nexus_pipelines.connectors.jira.adf import AdfError, to_adf, to_text
from nexus_pipelines.connectors.jira.config import JiraConfig
from nexus_pipelines.connectors.jira.limits import status_problem
from nexus_pipelines.connectors.jira.payloads import Comment, CommentPage, IssueStatus, Transitions
from nexus_pipelines.connectors.provider_http import (
    Deadline,
    MarkerLookup,
    Problem,
    after_close_write,
    after_comment_write,
    close_failure,
    close_receipt,
    earlier_comment,
    item_of,
    send,
)

COMMENT_PAGE = 100
MAX_COMMENT_PAGES = 50  # a marker lookup reads at most 5,000 comments before it calls itself inconclusive
_UNPARSED = "the answer does not parse"


def _parsed(model: type[BaseModel], response: httpx.Response) -> BaseModel | None:
    try:
        return model.model_validate_json(response.content)
    except ValidationError:
        return None


class CloseBack:
    """One invocation of comment-and-close for one Jira issue."""

    def __init__(self, http: httpx.Client, rest: str, config: JiraConfig, command: CloseExternalIssue,
                 deadline: Deadline) -> None:
        self._http = http
        self._config = config
        self._command = command
        self._deadline = deadline
        self._issue_id = item_of(command.external_ref, "jira", config.cloud_id)
        self._url = f"{rest}/issue/{self._issue_id}"

    def run(self) -> CloseExternalIssueResult:
        if self._issue_id is None:
            return CloseFailure(retry_class="terminal", reason="unsupported_item", write_disposition="not_written",
                                detail=f"{self._command.external_ref} is not an issue of Jira site "
                                       f"{self._config.cloud_id}")
        comment_id, failure = earlier_comment(self._command, self._find_marker)
        if failure is not None:
            return failure
        # A global ("from any status") transition to done is offered while the issue is done,
        # so the status is read first: an issue in the done category is not transitioned again.
        closed = self._is_closed()
        if isinstance(closed, Problem):
            return close_failure(closed)
        transition = None
        if not closed:
            transition, failure = self._done_transition()
            if failure is not None:
                return failure
        if comment_id is None:
            comment_id, failure = self._post_comment()
            if failure is not None:
                return failure
        return self._receipt(comment_id) if transition is None else self._transition(transition, comment_id)

    def _send(self, method: str, url: str, endpoint: str, **kwargs) -> httpx.Response | Problem:
        return send(self._http, method, url, self._deadline, endpoint, **kwargs)

    def _done_transition(self) -> tuple[str | None, CloseExternalIssueResult | None]:
        """The transition of an open issue to the done status."""
        response = self._send("GET", f"{self._url}/transitions", "get_transitions")
        if isinstance(response, Problem):
            return None, close_failure(response)
        if response.status_code != 200:
            return None, close_failure(status_problem(response, "listing transitions"))
        listed = _parsed(Transitions, response)
        if listed is None:
            return None, close_failure(Problem("retryable", "transport_protocol", f"listing transitions: {_UNPARSED}"))
        done = str(self._config.done_status_id)
        choices = [t for t in listed.transitions if t.to.id == done and t.isAvailable]
        if choices:
            return min(choices, key=lambda t: t.hasScreen).id, None  # a screen may ask for fields
        return None, close_failure(Problem("terminal", "ordinary_4xx", f"no transition to status {done} is "
                                           "available to this account from the issue's status (workflow or "
                                           "Transition issues permission)"))

    def _is_closed(self) -> bool | Problem:
        response = self._send("GET", self._url, "get_issue", params={"fields": "status"})
        if isinstance(response, Problem):
            return response
        if response.status_code != 200:
            return status_problem(response, "reading the issue")
        issue = _parsed(IssueStatus, response)
        if issue is None or issue.fields.status.state is None:
            return Problem("retryable", "transport_protocol", f"reading the issue: {_UNPARSED}")
        return issue.fields.status.state == "closed"

    def _post_comment(self) -> tuple[str | None, CloseExternalIssueResult | None]:
        response = self._send("POST", f"{self._url}/comment", "add_comment", json={"body": to_adf(self._command.comment)})
        problem = response if isinstance(response, Problem) else None
        if problem is None and response.status_code in (200, 201):  # Jira documents 201
            comment = _parsed(Comment, response)
            if comment is not None:
                return comment.id, None
            problem = Problem("retryable", "transport_protocol", f"adding the comment: {_UNPARSED}",
                              maybe_written=True)
        return after_comment_write(problem or status_problem(response, "adding the comment"), self._find_marker)

    def _transition(self, transition: str, comment_id: str) -> CloseExternalIssueResult:
        response = self._send("POST", f"{self._url}/transitions", "do_transition",
                              json={"transition": {"id": transition}})
        if isinstance(response, httpx.Response) and response.status_code in (200, 204):  # Jira documents 204
            return self._receipt(comment_id)
        problem = response if isinstance(response, Problem) else status_problem(response, "transitioning the issue")
        return after_close_write(problem, self._is_closed, lambda: self._receipt(comment_id))

    def _receipt(self, comment_id: str) -> ConnectorReceipt:
        return close_receipt(self._command, f"comment:{comment_id}")

    def _find_marker(self) -> MarkerLookup:
        """Every page of the issue's comments, oldest first, for the exact marker: found,
        absent (problem None), or inconclusive. Offset pages skip a comment only when an
        earlier one is deleted meanwhile, so a shrinking `total` makes the lookup inconclusive."""
        start, total = 0, None
        for _ in range(MAX_COMMENT_PAGES):
            response = self._send("GET", f"{self._url}/comment", "get_comments",
                                  params={"startAt": start, "maxResults": COMMENT_PAGE, "orderBy": "created"})
            if isinstance(response, Problem):
                return MarkerLookup(problem=response)
            if response.status_code != 200:
                return MarkerLookup(problem=status_problem(response, "reading comments"))
            page = _parsed(CommentPage, response)
            if page is None or page.startAt != start:
                return MarkerLookup(problem=Problem("retryable", "transport_protocol", f"reading comments: {_UNPARSED}"))
            if total is not None and page.total < total:
                return MarkerLookup(problem=Problem("retryable", "provider_5xx", "reading comments: a comment was "
                                               "deleted while they were read"))
            total = page.total
            for comment in page.comments:
                try:
                    if self._command.marker in to_text(comment.body):
                        return MarkerLookup(found=comment.id)
                except AdfError:
                    return MarkerLookup(problem=Problem("terminal", "invalid_payload", "reading comments: a body is "
                                                   "not an ADF document"))
            start += len(page.comments)
            if start >= total:
                return MarkerLookup()
            if not page.comments:
                return MarkerLookup(problem=Problem("retryable", "provider_5xx", "reading comments: an empty page "
                                               "before the total"))
        return MarkerLookup(problem=Problem("retryable", "provider_5xx", f"reading comments: more than "
                                       f"{MAX_COMMENT_PAGES} pages"))
