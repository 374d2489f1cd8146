"""How many of this machine's cores other processes keep busy: what the host rule re-checks against.

Imports only psutil. The system's busy CPU time (``/proc/stat`` through
psutil: user, nice, system, interrupts and steal, every core) less this
process's own (every thread), over the wall time between two looks, is the
cores others took meanwhile. A look costs a read of ``/proc/stat``: tens of
microseconds, once a period.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional, Tuple

import psutil

Reading = Tuple[float, float, float]  # (wall s, busy CPU s of the system, CPU s of this process)


def _read() -> Reading:
    t = psutil.cpu_times()
    busy = t.user + t.system + sum(getattr(t, f, 0.0) for f in ("nice", "irq", "softirq", "steal"))
    own = os.times()
    return time.monotonic(), busy, own.user + own.system


class OtherLoad:
    """Cores other processes took, measured over periods of ``period_s``.

    Use it from one thread (the worker that re-checks).

    Args:
      period_s: Shortest time between two looks; shorter ones answer None.
      read: Where readings come from (tests give a fake).
    """

    def __init__(self, period_s: float, read: Callable[[], Reading] = _read) -> None:
        self._period = period_s
        self._read = read
        self._last = read()

    def poll(self) -> Optional[float]:
        """Returns the cores others kept busy since the last answer, or None before ``period_s`` passed."""
        now = time.monotonic()
        if now - self._last[0] < self._period:
            return None
        reading = self._read()
        (t0, busy0, own0), (t1, busy1, own1) = self._last, reading
        self._last = reading
        if t1 <= t0:
            return None
        return max(0.0, ((busy1 - busy0) - (own1 - own0)) / (t1 - t0))
