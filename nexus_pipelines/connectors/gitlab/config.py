"""The GitLab registration's strict provider config."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from nexus_pipelines.credentials import check_reference
from nexus_pipelines.integrations.http import check_service_url

IssueType = Literal["issue", "incident", "test_case", "task"]


class GitLabConfig(BaseModel):
    """One GitLab project, addressed by its immutable numeric id.

    `token` is a reference to a project access token (role Planner, scope `api`).
    `issue_types` are the GitLab item types ingested as tickets; any other type in the
    project's issue list (tasks, test cases) is skipped and counted as excluded.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    base_url: str = Field(description="The GitLab instance, e.g. https://gitlab.com (the API is <base_url>/api/v4).")
    project_id: Annotated[int, Field(gt=0, description="The project's immutable numeric id (not its path).")]
    token: Annotated[str, AfterValidator(check_reference)] = Field(
        description="Credential reference to a project access token, e.g. env:GITLAB_TOKEN.")
    local_mode: bool = Field(default=False, description="Allow plain http to a loopback host (the simulator).")
    issue_types: list[IssueType] = Field(default_factory=lambda: ["issue", "incident"], min_length=1)

    @model_validator(mode="after")
    def _url(self) -> Self:
        try:
            check_service_url(self.base_url, local_mode=self.local_mode)
        except ValueError as exc:
            raise ValueError(f"base_url {exc}") from None
        return self

    @property
    def api_url(self) -> str:
        return self.base_url.rstrip("/") + "/api/v4"
