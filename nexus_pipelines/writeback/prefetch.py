"""Reading and mapping the next page of candidates on a background thread while the
current batch's CRM call is in flight (the write pass), with a gate so that this CPU
work does not compete with what the writer does between two CRM calls, nor with the
previous batch's commit."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

_DONE = object()


class Gate:
    """Open while a CRM call is in flight and no batch commit is, or while the consumer
    waits for data; the prefetch thread starts each page only through an open gate."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._state = {"crm": False, "committing": False, "starving": False, "closed": False}

    def set(self, **flags: bool) -> None:
        with self._cv:
            self._state.update(flags)
            self._cv.notify_all()

    @property
    def flags(self) -> dict[str, bool]:
        with self._cv:
            return dict(self._state)

    def _open(self) -> bool:
        s = self._state
        return (s["crm"] and not s["committing"]) or s["starving"] or s["closed"]

    def wait(self) -> None:
        with self._cv:
            self._cv.wait_for(self._open)


def gated(source: Iterator[Any], gate: Gate) -> Iterator[Any]:
    while True:
        gate.wait()
        try:
            item = next(source)
        except StopIteration:
            return
        yield item


def prefetch(source: Iterator[Any], depth: int, gate: Gate | None = None) -> Iterator[Any]:
    """Iterate `source` on a background thread, at most `depth` items ahead, so reading
    and mapping the next page overlaps the CRM call of the current batch."""
    if depth <= 0:
        if gate is not None:
            gate.set(starving=True)
        yield from source
        return
    items: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def work() -> None:
        try:
            for item in source:
                while not stop.is_set():
                    try:
                        items.put((True, item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put((True, _DONE))
        except BaseException as exc:  # handed to the consumer
            items.put((False, exc))

    thread = threading.Thread(target=work, name="writeback-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            if gate is not None and items.empty():
                gate.set(starving=True)
            ok, item = items.get()
            if gate is not None:
                gate.set(starving=False)
            if not ok:
                raise item
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        if gate is not None:
            gate.set(closed=True)
        while thread.is_alive():
            try:
                items.get(timeout=0.1)
            except queue.Empty:
                pass
            thread.join(timeout=0.1)
