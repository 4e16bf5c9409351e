"""Registrations: one YAML file per connector registration, loaded into an immutable
revision (docs/design/connector-contract.md, "Registrations and revisions").

A file names the registration key, tenant and ticket project, the connector kind, the
poll schedule and page bound, a provider-neutral source-label map and the provider's
strict config. Credentials are references (`env:NAME`, `file:/path`); a literal that
looks like a secret anywhere in the file is refused. The revision is the sha256 of
the canonical config, so an edited file is a new revision that never reuses the old
revision's cursor.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nexus_pipelines.connectors.core.registry import ConnectorRegistry, UnknownConnectorKind
from nexus_pipelines.connectors.core.values import KIND_PATTERN, LABEL_MAX_CHARS, MAX_PAGE_SIZE
from nexus_pipelines.credentials import SecretReferenceError, check_reference
from nexus_pipelines.redaction import looks_like_secret

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
Label = Annotated[str, Field(min_length=1, max_length=LABEL_MAX_CHARS)]


class RegistrationError(ValueError):
    """A registration file is not valid; the message names the file and the field, never a value."""


class RegistrationFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    key: Name
    tenant: Name
    project: Name
    kind: Annotated[str, Field(pattern=KIND_PATTERN)]
    poll_interval_seconds: Annotated[int, Field(ge=10, le=86_400)] = 300
    page_size: Annotated[int, Field(ge=1, le=MAX_PAGE_SIZE)] = MAX_PAGE_SIZE
    label_map: dict[Label, Label] = Field(default_factory=dict)
    provider: dict[str, Any]


@dataclass(frozen=True)
class Registration:
    """One immutable registration revision with its validated provider config."""

    key: str
    tenant: str
    project: str
    kind: str
    schema_id: str
    poll_interval_seconds: int
    page_size: int
    label_map: tuple[tuple[str, str], ...]
    provider: BaseModel
    credential_fields: tuple[str, ...]
    digest: str

    @property
    def registration_id(self) -> str:
        """The work-queue registration id of this key (its revisions are the generations)."""
        return f"{self.tenant}/{self.key}"

    @property
    def revision_id(self) -> str:
        return f"{self.key}@{self.digest.removeprefix('sha256:')[:12]}"

    def canonical(self) -> dict[str, Any]:
        """The non-secret canonical config (credential fields hold references only)."""
        return {
            "key": self.key,
            "tenant": self.tenant,
            "project": self.project,
            "kind": self.kind,
            "schema_id": self.schema_id,
            "poll_interval_seconds": self.poll_interval_seconds,
            "page_size": self.page_size,
            "label_map": dict(self.label_map),
            "provider": self.provider.model_dump(mode="json"),
        }

    def credential_references(self) -> dict[str, str]:
        return {name: getattr(self.provider, name) for name in self.credential_fields}

    def map_labels(self, labels: tuple[str, ...]) -> tuple[str, ...]:
        """The provider-neutral label map, applied deterministically (unmapped labels pass through)."""
        mapping = dict(self.label_map)
        return tuple(sorted({mapping.get(label, label) for label in labels}))


def _digest(canonical: Mapping[str, Any]) -> str:
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _secret_literals(value: Any, path: str, references: set[str]) -> list[str]:
    if isinstance(value, str):
        return [path] if path not in references and looks_like_secret(value) else []
    if isinstance(value, Mapping):
        found = []
        for k, v in value.items():
            found += [f"{path}.{k}"] if isinstance(k, str) and looks_like_secret(k) else []
            found += _secret_literals(v, f"{path}.{k}", references)
        return found
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in _secret_literals(v, f"{path}[{i}]", references)]
    return []


def _problems(exc: ValidationError, prefix: str = "") -> str:
    # Field paths and messages only: pydantic's own text would echo the input values.
    return "; ".join(
        f"{prefix}{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors(include_input=False)
    )


def parse_registration(data: Any, registry: ConnectorRegistry, *, source: str) -> Registration:
    try:
        raw = RegistrationFile.model_validate(data)
    except ValidationError as exc:
        raise RegistrationError(f"registration {source} is invalid: {_problems(exc)}") from None
    try:
        spec = registry[raw.kind]
    except UnknownConnectorKind as exc:
        raise RegistrationError(f"registration {source}: {exc.args[0]}") from None
    for field_name in spec.credential_fields:
        try:
            check_reference(raw.provider.get(field_name))
        except SecretReferenceError as exc:
            raise RegistrationError(f"registration {source}: provider.{field_name}: {exc}") from None
    leaked = _secret_literals(data, "registration", {f"registration.provider.{f}" for f in spec.credential_fields})
    if leaked:
        raise RegistrationError(
            f"registration {source}: {', '.join(leaked)} looks like a secret value; configs hold references "
            "such as env:NAME, never credentials"
        )
    try:
        provider = spec.config_model.model_validate(raw.provider)
    except ValidationError as exc:
        raise RegistrationError(f"registration {source} is invalid: {_problems(exc, 'provider.')}") from None
    label_map = tuple(sorted(raw.label_map.items()))
    shape = dict(
        key=raw.key, tenant=raw.tenant, project=raw.project, kind=raw.kind, schema_id=spec.schema_id,
        poll_interval_seconds=raw.poll_interval_seconds, page_size=raw.page_size, label_map=label_map,
        provider=provider, credential_fields=spec.credential_fields,
    )
    unsigned = Registration(**shape, digest="sha256:" + "0" * 64)
    return Registration(**shape, digest=_digest(unsigned.canonical()))


def load_registration(path: Path, registry: ConnectorRegistry) -> Registration:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise RegistrationError(f"registration {path} cannot be read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise RegistrationError(f"registration {path} is not valid YAML{where}") from None
    return parse_registration(data, registry, source=str(path.name))


def load_directory(directory: Path, registry: ConnectorRegistry) -> dict[str, Registration]:
    """Every `*.yaml` registration of a folder, by registration id; duplicate keys are refused."""
    found: dict[str, Registration] = {}
    for path in sorted(directory.glob("*.yaml")):
        registration = load_registration(path, registry)
        if registration.registration_id in found:
            raise RegistrationError(f"registration {path.name} repeats key {registration.registration_id}")
        found[registration.registration_id] = registration
    return found


def from_canonical(canonical: Mapping[str, Any], registry: ConnectorRegistry) -> Registration:
    """A stored revision's canonical config back into a Registration (for composition at drain time)."""
    data = dict(canonical)
    schema_id = data.pop("schema_id", None)
    registration = parse_registration(data, registry, source=f"stored revision of {data.get('key')!r}")
    if registration.schema_id != schema_id:
        raise RegistrationError(
            f"stored revision of {registration.key!r} was written for schema {schema_id}, but this release's "
            f"{registration.kind} connector is {registration.schema_id}"
        )
    return registration
