"""Re-probing failed devices: is an EdgeTPU that failed answering again?

What runs after a failure is the planner's (``edgecap.planner.choose_after``)
and switching is the supervisor's (``edgecap.supervisor``). A ``Prober``
thread probes each failed device again with exponential backoff
(``PROBE_FIRST_S`` doubling up to ``PROBE_MAX_S``) and reports it when it answers, so the captioner can re-plan onto every device again.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, Hashable, List, Optional, Tuple

from edgecap import faults
from edgecap.devices import DeviceSpec
from edgecap.errors import EdgecapError

PROBE_FIRST_S = 0.25
PROBE_MAX_S = 30.0

_log = logging.getLogger("edgecap")


def answers(device: DeviceSpec) -> bool:
    """Whether a failed device answers a probe now.

    An emulated EdgeTPU answers unless an injected fault keeps it away
    (``faults.current().answers``); a real one when libedgetpu's delegate
    opens on it again (probed in a child process first, see
    ``stages.load_edgetpu_delegate``).
    """
    if not faults.current().answers(str(device)):
        return False
    if device.kind != "tpu":
        return True
    from edgecap import stages  # opens libedgetpu: only for real devices

    try:
        stages.load_edgetpu_delegate(device)
    except EdgecapError:
        return False
    return True


class Prober:
    """Probes failed devices again with exponential backoff, on one thread of its own.

    Args:
      on_return: Called (on the prober's thread) with a device that answers again.
      probe: ``device -> bool`` (default ``answers``, which takes a ``DeviceSpec``).
    """

    def __init__(self, on_return: Callable[[Hashable], None], probe: Callable[[Hashable], bool] = answers) -> None:
        self._on_return = on_return
        self._probe = probe
        self._cond = threading.Condition()
        self._due: Dict[Hashable, Tuple[float, float]] = {}  # device -> (next probe, backoff)
        self._closed = False
        self._thread: Optional[threading.Thread] = None

    def watch(self, device: Hashable) -> None:
        """Starts probing ``device`` (again, from the shortest backoff)."""
        with self._cond:
            if self._closed:
                return
            self._due[device] = (time.monotonic() + PROBE_FIRST_S, PROBE_FIRST_S)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="edgecap-prober", daemon=True)
                self._thread.start()
            self._cond.notify()

    def forget(self, device: Hashable) -> None:
        """Stops probing ``device``."""
        with self._cond:
            self._due.pop(device, None)

    @property
    def watched(self) -> List[Hashable]:
        """The devices being probed."""
        with self._cond:
            return list(self._due)

    def close(self, timeout: float = 1.0) -> None:
        """Stops probing and joins the thread (a probe in progress is waited for, ``timeout`` at most)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    now = time.monotonic()
                    due = [d for d, (t, _) in self._due.items() if t <= now]
                    if due:
                        break
                    wake = min((t for t, _ in self._due.values()), default=None)
                    self._cond.wait(None if wake is None else wake - now)
            for device in due:
                try:
                    back = self._probe(device)  # outside the lock: a real probe takes a while
                except Exception as exc:  # an OSError from a driver must not end the probing
                    _log.warning("edgecap: probing %s failed (%s: %s); probing it again later",
                                 device, type(exc).__name__, exc)
                    back = False
                with self._cond:
                    if device not in self._due:
                        continue
                    if back:
                        del self._due[device]
                    else:
                        _, backoff = self._due[device]
                        backoff = min(2 * backoff, PROBE_MAX_S)
                        self._due[device] = (time.monotonic() + backoff, backoff)
                if back:
                    self._on_return(device)
