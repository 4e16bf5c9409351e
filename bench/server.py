"""The Postgres server a benchmark runs against, and the scratch folder it writes to."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def bench_server(name: str, **settings: str) -> Iterator[tuple[str, Path]]:
    """The admin DSN of the server under test and a scratch folder: NEXUS_PG_DSN, else a fresh
    embedded server in the folder with durable settings (fsync on, as in production) and
    `settings` added. The server is stopped and the folder removed on leaving (a full polling
    run's database and Dagster homes take about 800 MB)."""
    from nexus_pipelines.local.postgres import DURABLE_SETTINGS, EmbeddedPostgres

    folder = Path(tempfile.mkdtemp(prefix=f"nexus-bench-{name}-"))
    folder.chmod(0o755)  # the embedded server may run as another system user
    server = None
    try:
        if os.environ.get("NEXUS_PG_DSN"):
            admin = os.environ["NEXUS_PG_DSN"]
        else:
            server = EmbeddedPostgres(folder / "pg", settings={**DURABLE_SETTINGS, **settings})
            admin = server.start().dsn()
        yield admin, folder
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)
