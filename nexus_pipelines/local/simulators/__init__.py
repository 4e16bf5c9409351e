"""Stateful simulators of the third-party HTTP APIs the project calls, with fault injection."""
