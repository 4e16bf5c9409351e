"""The embedded local stack: Postgres, the BigQuery emulator, simulators and the demo."""
