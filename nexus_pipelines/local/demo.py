"""`make demo`: the local stack, then the main job end to end."""

from __future__ import annotations

import time
from collections.abc import Callable

from nexus_pipelines.local.stack import LocalStack
from nexus_pipelines.settings import load_settings


def run_demo(echo: Callable[[str], None]) -> int:
    started = time.monotonic()
    info = LocalStack(load_settings()).up()
    echo("local stack:")
    for line in info.lines():
        echo("  " + line)
    echo(f"stack ready in {time.monotonic() - started:.1f}s")
    return 0
