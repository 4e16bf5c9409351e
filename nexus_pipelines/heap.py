"""Keeping the garbage collector's full passes off a run's critical path.

CPython's full (oldest-generation) collection scans every tracked object of the process and
holds the interpreter lock while it does, so every thread of the run stops: the writeback's
writer, prefetch and commit threads, a poll's page loop, a drain's workers. A run's process
already holds the objects of its imports and clients (about 130,000 in the benches' runners
before their first run; more under Dagster), so each full collection during a run paused it
for tens to hundreds of milliseconds. Freezing the heap that exists when a run starts moves
those objects out of the collector's reach for the run's duration: its collections then scan
only what the run itself allocated.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def heap_before_frozen() -> Iterator[None]:
    """Within it, the objects that existed when it was entered are not scanned by the
    collector (nor collected); on leaving they are handed back to the oldest generation.
    Nested or concurrent uses are safe: a thaw only makes later collections scan more."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
