"""A separate process that composes one registration's adapter with the control plane's
provider gates and fetches its first page: prints the result as JSON (run with
`python -m tests.connectors.gate_process DSN REGISTRATION_FILE`)."""

import sys
from pathlib import Path

from nexus_pipelines.connectors.core.compose import compose
from nexus_pipelines.connectors.core.executor import RetryExecutor
from nexus_pipelines.connectors.core.registration import load_registration
from nexus_pipelines.connectors.core.registry import ComposeContext
from nexus_pipelines.connectors.core.values import FetchIssuePage
from nexus_pipelines.connectors.provider_gate import ProviderGates
from nexus_pipelines.connectors.registry import REGISTRY
from nexus_pipelines.control.db import make_pool


def main(dsn: str, registration_file: str) -> None:
    pool = make_pool(dsn, max_size=1)
    try:
        registration = load_registration(Path(registration_file), REGISTRY)
        adapter = compose(registration, REGISTRY, ComposeContext(gates=ProviderGates(pool)))
        result, _ = RetryExecutor().fetch(adapter, FetchIssuePage(cursor=None, page_size=10))
        print(result.model_dump_json())
    finally:
        pool.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
