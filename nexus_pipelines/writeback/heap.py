"""Keeping the garbage collector's full passes off a run's critical path.

CPython's full (oldest-generation) collection scans every tracked object of the process,
and it holds the interpreter lock while it does: the commit thread, the prefetch thread and
the writer all stop. A run process already holds the objects of its imports and clients
(about 130,000 in the writeback bench's runner before its first run; more under Dagster), so
each full collection during a run paused it for 100-250 ms. Freezing the heap that exists
when a run starts moves those objects out of the collector's reach for the run's duration:
its collections then scan only what the run itself allocated.
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
