"""What the host gave a bench run: on a virtual machine the hypervisor may run other guests
on this one's CPUs (`steal` in /proc/stat), and every figure of the run slows with it; the
load average does not show it."""

from __future__ import annotations

from pathlib import Path

_STAT = Path("/proc/stat")


def _cpu_ticks() -> list[int] | None:
    try:
        first = _STAT.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None  # not Linux
    # user nice system idle iowait irq softirq steal: the guest columns are counted in user
    return [int(n) for n in first[1:9]]


class Steal:
    """The share of this machine's CPU time stolen by the host since the object was made."""

    def __init__(self) -> None:
        self._start = _cpu_ticks()

    def pct(self) -> float | None:
        end = _cpu_ticks()
        if self._start is None or end is None:
            return None
        spent = [b - a for a, b in zip(self._start, end)]
        return round(100 * spent[7] / max(sum(spent), 1), 1)
