"""Writeback jobs, one package each; registered by name in `writeback.registry`."""
