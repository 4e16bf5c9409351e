"""GitHub Issues connector: `SPEC` is its static registry row."""

from nexus_pipelines.connectors.github.registration import SPEC

__all__ = ["SPEC"]
