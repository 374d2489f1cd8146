"""A host CNN's kernel threads, re-checked while it runs (the host rule's ``threads`` schedule).

Every ``planner.HOST_RECHECK_S`` it reads how many cores other processes
take (``edgecap.cpu_load``) and asks the host rule for the threads to run on
(``planner.host_threads``). A change is tried on the next
``planner.HOST_TRIAL_FRAMES`` frames and kept only if the planner finds them
clearly faster than the frames before it (``planner.keep_threads``): how much a
shared host's other processes slow kernel threads down depends on more than
a count of busy cores. A change dropped is not tried again until the load
moves by the rule's margin; and when the load proposes nothing for
``planner.HOST_EXPLORE_S``, the other count is tried anyway
(``planner.other_threads``), so a trial that won by chance does not hold for
good. Each thread count has an interpreter of its own, opened on the
stage's worker the first time it is wanted.
"""

from __future__ import annotations

import collections
import logging
import statistics
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from edgecap import cpu_load, planner
from edgecap.planner import HostSchedule

_log = logging.getLogger("edgecap")


class Rethreaded:
    """Runs a CPU stage on the kernel threads the host rule keeps choosing; one worker thread uses it.

    Args:
      schedule: The host schedule it started on (``StageRun.recheck``).
      threads: The kernel threads at start.
      open_: ``threads -> runner``: opens the stage on that many kernel threads.
      load: Where other processes' load is read (default: ``cpu_load.OtherLoad``).

    Attributes:
      changes: ``(threads from, threads to, kept)`` of every change tried, in order.
    """

    def __init__(self, schedule: HostSchedule, threads: int, open_: Callable[[int], Any],
                 load: Optional[Any] = None) -> None:
        self._schedule, self._open = schedule, open_
        self._threads = threads
        self._runners: Dict[int, Any] = {threads: open_(threads)}
        self._load = load if load is not None else cpu_load.OtherLoad(planner.HOST_RECHECK_S)
        self._recent: Deque[float] = collections.deque(maxlen=planner.HOST_TRIAL_FRAMES)
        self._trial: Optional[Tuple[int, float, float]] = None  # threads before, their ms, load when tried
        self._dropped: Optional[float] = None  # the load at which the last change tried was dropped
        self._tried = time.monotonic()  # when the last trial began (the start counts as one)
        self.changes: List[Tuple[int, int, bool]] = []

    @property
    def threads(self) -> int:
        """The kernel threads it runs on now."""
        return self._threads

    def __call__(self, tensors: Any) -> Any:
        if self._trial is None:
            self._look()
        start = time.perf_counter()
        out = self._runners[self._threads](tensors)
        self._recent.append((time.perf_counter() - start) * 1e3)
        if self._trial is not None and len(self._recent) == self._recent.maxlen:
            self._decide()
        return out

    def _look(self) -> None:
        """Starts a trial of the threads the host rule takes for the load now, if they differ."""
        taken = self._load.poll()
        if taken is None or len(self._recent) < 2:
            return
        want = planner.host_threads(self._schedule, taken, self._threads)
        if want != self._threads and self._dropped is not None and \
                abs(taken - self._dropped) <= planner.HOST_RECHECK_MARGIN:
            want = self._threads  # tried at this load already, and it was slower
        if want == self._threads and time.monotonic() - self._tried >= planner.HOST_EXPLORE_S:
            want = planner.other_threads(self._schedule, self._threads)
        if want == self._threads:
            return
        self._trial = (self._threads, statistics.median(self._recent), taken)
        self._tried = time.monotonic()
        self._switch(want)

    def _decide(self) -> None:
        """Ends a trial: keeps its threads if they ran faster, else goes back."""
        before, before_ms, taken = self._trial
        after, after_ms = self._threads, statistics.median(self._recent)
        self._trial = None
        kept = planner.keep_threads(before_ms, after_ms)
        self.changes.append((before, after, kept))
        _log.info("edgecap: host: the CNN on %d kernel thread(s) took %.2f ms a frame against %.2f on %d, "
                  "other processes taking %.1f of %d cores: %s", after, after_ms, before_ms, before, taken,
                  self._schedule.cores, "kept" if kept else "back")
        if kept:
            self._dropped = None
        else:
            self._dropped = taken
            self._switch(before)

    def _switch(self, threads: int) -> None:
        if threads not in self._runners:
            self._runners[threads] = self._open(threads)
        self._threads = threads
        self._recent.clear()

    def close(self) -> None:
        """Closes every interpreter it opened."""
        for runner in self._runners.values():
            runner.close()
