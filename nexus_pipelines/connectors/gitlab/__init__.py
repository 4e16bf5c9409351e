"""GitLab Issues connector: `SPEC` is its static registry row."""

from nexus_pipelines.connectors.gitlab.registration import SPEC

__all__ = ["SPEC"]
