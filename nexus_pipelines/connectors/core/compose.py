"""The composition root: one registration revision -> one adapter
(docs/design/connector-contract.md, "Composition and secrets").

Validates the revision's strict provider config, resolves its credential references
from the deployment's secret source (environment variables or files), and builds the
adapter through the static registry. This is the only place a credential value
exists outside an adapter's transport; it never returns to core values.
"""

from __future__ import annotations

from collections.abc import Mapping

from nexus_pipelines.connectors.core.protocol import IssueConnector
from nexus_pipelines.connectors.core.registration import Registration, RegistrationError
from nexus_pipelines.connectors.core.registry import ComposeContext, ConnectorRegistry
from nexus_pipelines.credentials import SecretReferenceError, resolve


class CompositionError(RuntimeError):
    """The adapter cannot be composed; one line naming the registration and the reference."""


def compose(
    registration: Registration,
    registry: ConnectorRegistry,
    context: ComposeContext = ComposeContext(),
    *,
    environ: Mapping[str, str] | None = None,
) -> IssueConnector:
    spec = registry[registration.kind]
    if spec.schema_id != registration.schema_id:
        raise RegistrationError(
            f"registration {registration.revision_id} was written for schema {registration.schema_id}, "
            f"but this release's {spec.kind} connector is {spec.schema_id}; register it again"
        )
    secrets = {}
    for name, reference in registration.credential_references().items():
        try:
            secrets[name] = resolve(reference, environ=environ)
        except SecretReferenceError as exc:
            raise CompositionError(f"connector {registration.revision_id}: {exc}") from None
    adapter = spec.build(registration.provider, secrets, context)
    if not isinstance(adapter, IssueConnector):
        raise CompositionError(f"connector kind {spec.kind!r} built something that is not an IssueConnector")
    return adapter


class CachedComposer:
    """Composes each revision once per process (adapters hold pooled HTTP clients) and
    closes them all at the end; thread-safe, since drains run handlers on a pool."""

    def __init__(self, registry: ConnectorRegistry, context: ComposeContext = ComposeContext(), *,
                 environ: Mapping[str, str] | None = None) -> None:
        import threading

        self._registry = registry
        self._context = context
        self._environ = environ
        self._adapters: dict[str, IssueConnector] = {}
        self._lock = threading.Lock()

    def __call__(self, registration: Registration) -> IssueConnector:
        with self._lock:
            adapter = self._adapters.get(registration.digest)
            if adapter is None:
                adapter = compose(registration, self._registry, self._context, environ=self._environ)
                self._adapters[registration.digest] = adapter
            return adapter

    def close(self) -> None:
        with self._lock:
            for adapter in self._adapters.values():
                close = getattr(adapter, "close", None)
                if callable(close):
                    close()
            self._adapters.clear()
