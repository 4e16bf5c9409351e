"""Issue intake and close-back (seed 002): the provider-neutral core, the providers
(one package each) and their static registry, and the Dagster wiring."""
