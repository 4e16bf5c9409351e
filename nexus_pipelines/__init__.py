"""Dagster code location for NexusCRM writeback, issue intake and durable work queues."""
