"""Jira's REST API v3 payloads, strict and reduced to what the adapter maps or decides on
(Jira sends many more keys, which are ignored)."""

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

_RAW = ConfigDict(extra="ignore", frozen=True, strict=True)
_ID = Field(pattern=r"^[0-9]{1,18}$")
# Jira's status categories: "done" is closed; "undefined" is the "No Category" of old statuses.
STATE_OF_CATEGORY = {"new": "open", "indeterminate": "open", "undefined": "open", "done": "closed"}


class Ref(BaseModel):
    model_config = _RAW
    id: str = _ID


class _Category(BaseModel):
    model_config = _RAW
    key: str


class Status(BaseModel):
    model_config = _RAW
    id: str = _ID
    statusCategory: _Category  # noqa: N815 - Jira's names

    @property
    def state(self) -> str | None:
        """open, closed, or None for a category Jira does not document."""
        return STATE_OF_CATEGORY.get(self.statusCategory.key)


class User(BaseModel):
    model_config = _RAW
    accountId: str = Field(min_length=1, max_length=128)  # noqa: N815
    displayName: str = ""  # noqa: N815 - absent when the profile hides it


class IssueType(BaseModel):
    """A work type as an issue carries it: a sub-task says so itself (`subtask`, and
    `hierarchyLevel` -1), whichever of a site's sub-task types or a team-managed project's
    own types it is."""

    model_config = _RAW
    id: str = _ID
    subtask: bool
    hierarchyLevel: int | None = None  # noqa: N815

    @property
    def is_subtask(self) -> bool:
        return self.subtask or self.hierarchyLevel == -1


class Fields(BaseModel):
    model_config = _RAW
    summary: str
    description: dict | None
    labels: list[str]
    reporter: User | None  # an anonymous or removed reporter
    status: Status
    updated: AwareDatetime
    project: Ref
    issuetype: IssueType


class Issue(BaseModel):
    model_config = _RAW
    id: str = _ID
    key: str = Field(pattern=r"^[A-Z][A-Z0-9_]*-[0-9]+$")
    fields: Fields


class Search(BaseModel):
    """GET /rest/api/3/search/jql: `nextPageToken` is absent (or null) on the last page."""

    model_config = _RAW
    issues: list[Issue] = Field(default_factory=list)  # optional in Jira's schema: an empty page
    nextPageToken: str | None = None  # noqa: N815
    isLast: bool | None = None  # noqa: N815


class StatusFields(BaseModel):
    model_config = _RAW
    status: Status


class IssueStatus(BaseModel):
    """GET /rest/api/3/issue/{id}?fields=status"""

    model_config = _RAW
    id: str = _ID
    fields: StatusFields


class Comment(BaseModel):
    model_config = _RAW
    id: str = _ID
    body: dict  # an ADF document


class CommentPage(BaseModel):
    """GET /rest/api/3/issue/{id}/comment: offset paging with `startAt` and `total`."""

    model_config = _RAW
    startAt: int = Field(ge=0)  # noqa: N815
    total: int = Field(ge=0)
    comments: list[Comment]


class Transition(BaseModel):
    model_config = _RAW
    id: str = _ID
    to: Ref
    hasScreen: bool = False  # noqa: N815
    isAvailable: bool = True  # noqa: N815


class Transitions(BaseModel):
    """GET /rest/api/3/issue/{id}/transitions: what the account may do from the current status."""

    model_config = _RAW
    transitions: list[Transition]
