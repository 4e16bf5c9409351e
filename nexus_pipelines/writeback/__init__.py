"""NexusCRM writeback (docs/design/writeback-run.md): BigQuery rows -> typed mapping -> batched
external-ID upserts into one NexusCRM custom object, with a Postgres ledger.

Domain modules here import no Dagster; `assets.py`, `checks.py`, `schedules.py`,
`definitions.py` and `cli.py` wire them into Dagster and the CLI.
"""
