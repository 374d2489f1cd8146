"""Whether the wall clock can be trusted to age the history: it did not step since the history opened.

A board without a battery-backed clock boots with a stale time and NTP steps
it, and a person may set it wrong and right again; retention by age must not
delete a month of events because the clock jumped. ``StepWatch`` compares the
wall clock with the boot-time clock (monotonic, counting suspend) since it was
anchored: within the tolerance (2 s plus 1 ms a second, more than NTP's
slewing) it follows slow changes; past it, the wall clock stepped.
"""

from __future__ import annotations

import time
from typing import Callable

STEP_S = 2.0  # a difference beyond this (plus DRIFT a second) is a step, not a slew
DRIFT = 0.001  # NTP slews at most 0.0005 s a second


def _boottime() -> float:
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):  # not Linux
        return time.monotonic()


class StepWatch:
    """Measures how far the wall clock stepped since it was anchored.

    Args:
      wall: The wall clock (``time.time``).
      steady: A clock that never steps (the boot-time clock).
    """

    def __init__(self, wall: Callable[[], float] = time.time, steady: Callable[[], float] = _boottime) -> None:
        self._wall, self._steady = wall, steady
        self._wall0, self._steady0 = wall(), steady()
        self.stepped = 0.0  # seconds, since the anchor: > 0 forward, < 0 back

    def check(self) -> float:
        """Returns the step since the anchor (0.0 while there is none), re-anchoring while there is none."""
        wall, steady = self._wall(), self._steady()
        elapsed = steady - self._steady0
        step = wall - (self._wall0 + elapsed)
        if abs(step) <= STEP_S + DRIFT * elapsed:
            self._wall0, self._steady0 = wall, steady  # a slew: follow it
            self.stepped = 0.0
        else:
            self.stepped = step
        return self.stepped
