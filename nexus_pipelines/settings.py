"""Environment settings shared by the CLI, the Dagster resources and the local stack.

Every variable is read from the process environment (no `.env` file is read); none of
them holds a secret value: CRM and provider credentials are referenced by the *names*
of their environment variables in job configs.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CONTROL_SCHEMA = "nexus_control"


class NexusSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NEXUS_", extra="ignore", frozen=True)

    pg_dsn: str | None = Field(
        default=None,
        description="libpq DSN of the control-plane Postgres. Unset, only `local up|status|down` and `demo` run "
        "(on the embedded server, whose DSN `. .nexus_local/env` exports); every other command refuses to run.",
    )
    local_dir: Path = Field(
        default=PROJECT_ROOT / ".nexus_local",
        description="Where the embedded stack keeps Postgres data, emulator data and DAGSTER_HOME.",
    )
    local_stack: bool = Field(
        default=False,
        description="Set by `. .nexus_local/env`: the code location runs on the embedded stack, so writeback "
        "jobs default to their local configs (the simulators); never set in production.",
    )
    sandbox_ports: tuple[int, int, int, int] | None = Field(
        default=None,
        description="The local stack's NexusCRM, GitLab, GitHub and Jira simulator ports, as a JSON list "
        "(another stack beside the default one); unset: 18928-18931, the ports the local registrations name.",
    )
    bq_project: str = Field(default="nexus-local", description="BigQuery project for queries and jobs.")
    bq_location: str = Field(default="US", description="BigQuery location for query jobs.")
    connectors_dir: Path = Field(
        default=PROJECT_ROOT / "configs" / "connectors",
        description="The folder of connector registration files the code location loads (the local stack "
        "points it at configs/connectors/local).",
    )
    triage_max_age_hours: float = Field(
        default=24.0, gt=0,
        description="The tickets' triage check warns while an unresolved triage finding is older than this.",
    )
    bq_emulator_url: str | None = Field(
        default=None,
        description="BigQuery emulator endpoint; unset means real BigQuery with Application Default Credentials.",
    )


def load_settings() -> NexusSettings:
    return NexusSettings()
