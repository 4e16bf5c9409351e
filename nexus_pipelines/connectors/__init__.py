"""Issue intake and close-back (docs/design/connector-contract.md): the provider-neutral core, the providers
(one package each) and their static registry, and the Dagster wiring."""
