"""The GitHub registration's strict provider config: one repository of one App installation."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from nexus_pipelines.credentials import check_reference
from nexus_pipelines.integrations.http import check_service_url

GITHUB_API = "https://api.github.com"
_NAME = r"^[A-Za-z0-9_.-]{1,100}$"
Id = Annotated[int, Field(gt=0)]


class GitHubConfig(BaseModel):
    """Identity is `repository_id` (immutable); `owner`/`repo` are presentation only: the
    adapter addresses the repository by the name GitHub reports for that id when it mints
    an installation token. `private_key` is a reference to the App's PEM private key."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    api_url: str = Field(default=GITHUB_API, description="The REST API origin: https://api.github.com, or "
                                                         "https://HOST/api/v3 for GitHub Enterprise Server.")
    app_id: Id = Field(description="The GitHub App's numeric id (its settings page, 'App ID').")
    installation_id: Id = Field(description="The id of the App's installation on the repository's account.")
    repository_id: Id = Field(description="The repository's immutable numeric id (GET /repos/OWNER/REPO: `id`).")
    owner: Annotated[str, Field(pattern=_NAME)] = Field(description="Presentation only: the owner at registration.")
    repo: Annotated[str, Field(pattern=_NAME)] = Field(description="Presentation only: the name at registration.")
    private_key: Annotated[str, AfterValidator(check_reference)] = Field(
        description="Credential reference to the App's private key, e.g. file:/run/secrets/github-app.pem.")
    local_mode: bool = Field(default=False, description="Allow plain http to a loopback host (the simulator).")

    @model_validator(mode="after")
    def _url(self) -> Self:
        try:
            check_service_url(self.api_url, local_mode=self.local_mode)
        except ValueError as exc:
            raise ValueError(f"api_url {exc}") from None
        return self
