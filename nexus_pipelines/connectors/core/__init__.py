"""Provider-neutral connector core (docs/design/connector-contract.md): values, protocol, retry executor, registration,
static-registry types, close-command derivation, the poll tick and its Postgres store.

No provider name and no Dagster import lives here. Together with `nexus_pipelines/tickets/`,
the connector migrations (sql/control/0030-0039) and `tests/connectors/conformance/`, this
package is the freeze set: adding a provider must not change it (the contract page, "The static
registry and the freeze set").
"""
