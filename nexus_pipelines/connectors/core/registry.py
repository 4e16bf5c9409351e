"""The static connector registry's types: kind -> strict config parser and factory
(docs/design/connector-contract.md, "The static registry and the freeze set").

The table itself is `nexus_pipelines/connectors/registry.py`, one reviewed row per
provider. Construction refuses duplicate kinds and schema ids; there is no import
string, entry point or executable config anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import httpx
from pydantic import BaseModel, SecretStr

from nexus_pipelines.connectors.core.protocol import IssueConnector
from nexus_pipelines.connectors.provider_gate import Gate, GatePolicy, ProviderGates
from nexus_pipelines.integrations.http import CallCounter
from nexus_pipelines.connectors.core.values import KIND_PATTERN


@dataclass(frozen=True)
class ComposeContext:
    """What the composition root hands a factory besides config and resolved secrets: an
    injected transport (the simulators, in tests) or None for the real network, the call
    counter the adapter's HTTP client reports to, and the control plane's provider gates
    (every composer of the code location passes them; None only for an adapter tested on
    its own answers)."""

    transport: httpx.BaseTransport | None = None
    counter: CallCounter | None = None
    gates: ProviderGates | None = None

    def gate(self, policy: GatePolicy) -> Gate | None:
        return self.gates.gate(policy) if self.gates is not None else None


Factory = Callable[[BaseModel, Mapping[str, SecretStr], ComposeContext], IssueConnector]


@dataclass(frozen=True)
class ConnectorSpec:
    kind: str
    schema_id: str
    config_model: type[BaseModel]
    credential_fields: tuple[str, ...]  # config fields that hold credential references
    build: Factory
    permissions: str  # the least provider scope the registration needs, for operators


class UnknownConnectorKind(KeyError):
    pass


class ConnectorRegistry(Mapping[str, ConnectorSpec]):
    def __init__(self, specs: Iterable[ConnectorSpec]) -> None:
        import re

        by_kind: dict[str, ConnectorSpec] = {}
        schemas: set[str] = set()
        for spec in specs:
            if not re.match(KIND_PATTERN, spec.kind):
                raise ValueError(f"connector kind {spec.kind!r} must match {KIND_PATTERN}")
            if spec.kind in by_kind:
                raise ValueError(f"connector kind {spec.kind!r} is registered twice")
            if spec.schema_id in schemas:
                raise ValueError(f"connector schema id {spec.schema_id!r} is registered twice")
            missing = [f for f in spec.credential_fields if f not in spec.config_model.model_fields]
            if missing:
                raise ValueError(f"connector {spec.kind!r} declares credential fields it has no config for: {missing}")
            by_kind[spec.kind] = spec
            schemas.add(spec.schema_id)
        self._specs = by_kind

    def __getitem__(self, kind: str) -> ConnectorSpec:
        try:
            return self._specs[kind]
        except KeyError:
            known = ", ".join(sorted(self._specs)) or "none"
            raise UnknownConnectorKind(f"unknown connector kind {kind!r} (registered: {known})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)
