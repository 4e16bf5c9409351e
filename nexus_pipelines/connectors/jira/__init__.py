"""Jira Cloud connector: `SPEC` is its static registry row."""

from nexus_pipelines.connectors.jira.registration import SPEC

__all__ = ["SPEC"]
