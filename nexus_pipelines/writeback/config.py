"""Job configuration (docs/design/writeback-run.md, "Steps"): a strict model plus safe SQL
path resolution.

The YAML owns environment, transport, state and execution-policy facts; the
registered job owns its name and the mapper owns the target object and fields.
Secrets are never in YAML: `target.*_env` name the environment variables that hold
the base URL, client id and client secret.

Local mode: `target.local_mode: true` allows an `http://` base URL, and only to a
loopback host (127.0.0.1, ::1, localhost), which is how the local stack serves the
NexusCRM simulator. With it off (the default, and what every production config
uses) the base URL must be https.
"""

from __future__ import annotations

import re
import zoneinfo
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from nexus_pipelines import yaml_locations
from nexus_pipelines.integrations.nexuscrm import longest_batch_call_s
from nexus_pipelines.settings import PROJECT_ROOT
from nexus_pipelines.yaml_locations import Located

_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_IDENT = re.compile(r"^[A-Za-z0-9_.\-]+$")
_DATASET = re.compile(r"^[A-Za-z0-9_]+$")
_PROJECT = re.compile(r"^[A-Za-z0-9_\-]+$")  # no dot: table ids are split on "." into project.dataset.table
_CRON_FIELD = re.compile(r"^[0-9*/,\-A-Za-z?]+$")
LEASE_MARGIN_S = 60  # room for the batch's ledger commit and a renewal round trip
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


class ConfigError(ValueError):
    """The config file is unusable; the message says which key and why."""


def _env_name(value: str) -> str:
    if not isinstance(value, str) or not _ENV_NAME.match(value):
        raise ValueError("must name an environment variable (UPPER_CASE letters, digits, underscores)")
    return value


def _project_id(value: str) -> str:
    if not _PROJECT.match(value):
        raise ValueError("not a project id")
    return value


EnvVarName = Annotated[str, Field(min_length=1)]
ProjectId = Annotated[str, Field(min_length=1), AfterValidator(_project_id)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SourceConfig(_Strict):
    project: ProjectId
    location: str = Field(min_length=1)
    sql_file: str = Field(min_length=1)
    readiness_sql_file: str = Field(min_length=1)
    freshness_max_age_minutes: int = Field(gt=0, le=60 * 24 * 90)
    # Values substituted for ${name} placeholders in both SQL files (dataset names and
    # the like; identifiers only, never data: data goes through query parameters).
    sql_vars: dict[str, str] = Field(default_factory=dict)

    @field_validator("sql_vars")
    @classmethod
    def _vars(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not re.match(r"^[a-z_][a-z0-9_]*$", key) or not _IDENT.match(item):
                raise ValueError(f"sql_vars.{key}: names and values must be plain identifiers")
        return value


class TargetConfig(_Strict):
    base_url_env: EnvVarName
    api_version: Literal["v63.0"]
    client_id_env: EnvVarName
    client_secret_env: EnvVarName
    local_mode: bool = False

    @field_validator("base_url_env", "client_id_env", "client_secret_env")
    @classmethod
    def _env(cls, value: str) -> str:
        return _env_name(value)


class StateConfig(_Strict):
    project: ProjectId
    dataset: str = Field(min_length=1)

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str) -> str:
        if not _DATASET.match(value):
            raise ValueError("not a dataset name")
        return value


class WriteConfig(_Strict):
    batch_size: int = Field(ge=1, le=200)
    all_or_none: Literal[False] = False
    skip_unchanged: bool = True
    delete_policy: Literal["ignore"] = "ignore"
    max_attempts: int = Field(default=5, ge=1, le=10)
    base_backoff_seconds: float = Field(default=1, ge=0, le=60)
    max_backoff_seconds: float = Field(default=30, ge=0, le=600)
    lease_ttl_seconds: int = Field(default=1800, ge=30, le=3600)
    # Other integrations share the org's daily API allocation: the run stops before it
    # would use the last `api_headroom_percent` of it (0: use it all).
    api_headroom_percent: float = Field(default=0, ge=0, lt=100)

    @model_validator(mode="after")
    def _backoff(self) -> WriteConfig:
        if self.max_backoff_seconds < self.base_backoff_seconds:
            raise ValueError("max_backoff_seconds must be >= base_backoff_seconds")
        # The lease is renewed before each batch; it must outlive the longest CRM call plus
        # the batch's ledger commit, or a slow batch could hand the job to a second writer.
        longest = longest_batch_call_s(self.max_attempts, self.max_backoff_seconds) + LEASE_MARGIN_S
        if self.lease_ttl_seconds < longest:
            raise ValueError(
                f"lease_ttl_seconds ({self.lease_ttl_seconds}) must be at least {longest:.0f}: one CRM batch can take "
                f"{longest - LEASE_MARGIN_S:.0f} s with max_attempts={self.max_attempts} and "
                f"max_backoff_seconds={self.max_backoff_seconds:g}; raise it or lower those")
        return self


class ScheduleConfig(_Strict):
    cron: str = Field(min_length=1)
    timezone: str = "UTC"
    paused: bool = True

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        parts = value.split()
        if len(parts) != 5 or not all(_CRON_FIELD.match(p) for p in parts):
            raise ValueError("must be a five-field cron expression")
        return value

    @field_validator("timezone")
    @classmethod
    def _tz(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown IANA timezone {value!r}") from None
        return value


class JobConfig(_Strict):
    version: Literal[1]
    source: SourceConfig
    target: TargetConfig
    state: StateConfig
    write: WriteConfig
    schedule: ScheduleConfig


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config with its SQL files resolved inside the repository root."""

    config: JobConfig
    path: Path | None
    sql_path: Path
    readiness_sql_path: Path

    def source_sql(self) -> str:
        return render_sql(self.sql_path.read_text(), self.config.source.sql_vars)

    def readiness_sql(self) -> str:
        return render_sql(self.readiness_sql_path.read_text(), self.config.source.sql_vars)


def render_sql(text: str, variables: dict[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in variables:
            raise ConfigError(f"SQL placeholder ${{{name}}} has no value in source.sql_vars")
        return variables[name]

    return re.sub(r"\$\{([a-z_][a-z0-9_]*)\}", substitute, text)


def resolve_sql_path(relative: str, base_dir: Path, root: Path = PROJECT_ROOT) -> Path:
    """`relative` resolved against `base_dir`; refuses absolute paths and anything that
    escapes `root` (including through symlinks)."""
    candidate = Path(relative)
    if candidate.is_absolute():
        raise ConfigError(f"SQL path {relative!r} must be relative to the config file")
    resolved = (base_dir / candidate).resolve()
    root = root.resolve()
    if resolved != root and root not in resolved.parents:
        raise ConfigError(f"SQL path {relative!r} escapes the repository root {root}")
    if resolved.suffix != ".sql":
        raise ConfigError(f"SQL path {relative!r} must name a .sql file")
    if not resolved.is_file():
        raise ConfigError(f"SQL file {relative!r} does not exist (resolved to {resolved})")
    return resolved


def _validation_message(source: str, exc: ValidationError, located: Located | None) -> str:
    problems = []
    for error in exc.errors(include_input=False, include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "<top level>"
        unknown = error["type"] == "extra_forbidden"
        at = located.where(error["loc"], key=unknown) if located else ""
        message = "unknown key" if unknown else error["msg"]
        problems.append(f"{where} ({at}): {message}" if at else f"{where}: {message}")
    return f"{source}: invalid job config: " + "; ".join(problems)


def parse_config(data: Any, *, base_dir: Path, root: Path = PROJECT_ROOT, source: str = "config",
                 located: Located | None = None) -> LoadedConfig:
    """`located` (the file's key and value positions) lets each problem name its line and column."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a job config must be a YAML mapping")
    try:
        config = JobConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_validation_message(source, exc, located)) from None
    sql_path = resolve_sql_path(config.source.sql_file, base_dir, root)
    readiness = resolve_sql_path(config.source.readiness_sql_file, base_dir, root)
    return LoadedConfig(config, None, sql_path, readiness)


def load_config(path: str | Path, *, root: Path = PROJECT_ROOT) -> LoadedConfig:
    """A relative `path` is taken from the project root `root`, never the working directory (the
    Dagster UI of `make dev` runs in .nexus_local/, a run launcher anywhere)."""
    given = Path(path)
    path = (given if given.is_absolute() else root / given).resolve()
    try:
        text = path.read_text()
    except OSError as exc:
        relative = "" if given.is_absolute() else f" (a relative config path is taken from the project root {root})"
        raise ConfigError(f"cannot read job config {path}{relative}: {exc.strerror}") from None
    try:
        located = yaml_locations.load(text)
    except yaml_locations.YamlSyntaxError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    loaded = parse_config(located.data, base_dir=path.parent, root=root, source=str(path), located=located)
    return LoadedConfig(loaded.config, path, loaded.sql_path, loaded.readiness_sql_path)


def check_target_url(url: str, *, local_mode: bool) -> str:
    """https outside local mode; local mode allows http to loopback only."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if not parts.netloc or parts.scheme not in ("https", "http"):
        raise ConfigError("the NexusCRM base URL must be an absolute https URL")
    if parts.scheme == "http":
        if not local_mode:
            raise ConfigError("the NexusCRM base URL must use https (http is allowed only with target.local_mode)")
        if (parts.hostname or "") not in LOOPBACK_HOSTS:
            raise ConfigError("target.local_mode allows http only to a loopback host")
    return url
