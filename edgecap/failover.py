"""Re-probing failed devices: is an EdgeTPU that failed answering again?

What runs after a failure is the planner's (``edgecap.planner.choose_after``)
and switching is the supervisor's (``edgecap.supervisor``). A ``Prober``
thread probes each failed device again with exponential backoff and reports
it when it answers, so the captioner can re-plan onto every device again.

A flapping device is damped: each failure of a device that had not yet run
``stable_s`` since it was taken back doubles the first wait before it is
probed again (``first_s``, ``2 first_s``, ... up to ``max_s``); a device
that ran that long starts from ``first_s`` again. The values and their
reasons are in ``data/recovery.json`` (``reprobe``), with the first-invoke
allowance of the deadline policy (``first_invoke``, read by
``edgecap.planner.deadlines``).
"""

from __future__ import annotations

import logging
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable, Dict, Hashable, List, Optional, Tuple

import msgspec

from edgecap import faults, schema
from edgecap.devices import DeviceSpec
from edgecap.errors import ConfigError, EdgecapError

RECOVERY = Path(__file__).parent / "data" / "recovery.json"

_log = logging.getLogger("edgecap")


class Reprobe(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """When a failed device is probed again (``data/recovery.json``, ``reprobe``).

    Attributes:
      first_s: The wait before the first probe after a first failure.
      max_s: The longest wait between two probes.
      stable_s: Seconds a device must run, once taken back, for its next
        failure to count as a first failure again.
    """

    first_s: float
    max_s: float
    stable_s: float
    why: Dict[str, str] = {}

    def first_wait(self, strikes: int) -> float:
        """The wait before the first probe after the ``strikes``-th failure in a row (1: a first failure)."""
        return min(self.first_s * 2.0 ** min(strikes - 1, 64), self.max_s)


class FirstInvoke(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What a stage's first invoke may add to its deadline (``data/recovery.json``, ``first_invoke``).

    Attributes:
      load_bytes_per_s: The slowest rate on-chip parameters load at.
      load_margin: The load may take this many times its bytes' time.
      min_load_s: The least the first invoke gets on top of the deadline.
      unknown_on_chip_bytes: On-chip bytes charged when a plan records none.
    """

    load_bytes_per_s: float
    load_margin: float
    min_load_s: float
    unknown_on_chip_bytes: int
    why: Dict[str, str] = {}

    def load_s(self, on_chip_bytes: int) -> float:
        """Seconds a stage's first invoke may spend loading ``on_chip_bytes`` (0: unknown)."""
        size = on_chip_bytes or self.unknown_on_chip_bytes
        return max(self.min_load_s, self.load_margin * size / self.load_bytes_per_s)


class Recovery(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """``data/recovery.json``."""

    about: str
    reprobe: Reprobe
    first_invoke: FirstInvoke


@lru_cache(maxsize=None)
def load_recovery(path: Path = RECOVERY) -> Recovery:
    """Reads the recovery policy's values.

    Raises:
      ConfigError: If the file is missing or malformed.
    """
    return schema.read_file(path, Recovery, what="recovery policy", fix="reinstall edgecap",
                            error=ConfigError)


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
      policy: The waits (default: ``data/recovery.json``'s).
    """

    def __init__(self, on_return: Callable[[Hashable], None], probe: Callable[[Hashable], bool] = answers,
                 policy: Optional[Reprobe] = None) -> None:
        self._on_return = on_return
        self._probe = probe
        self.policy = policy or load_recovery().reprobe
        self._cond = threading.Condition()
        self._due: Dict[Hashable, Tuple[float, float]] = {}  # device -> (next probe, backoff)
        # Per device: failures in a row (none a stable period after a return), and when it last answered.
        self._strikes: Dict[Hashable, int] = {}
        self._back_at: Dict[Hashable, float] = {}
        self._closed = False
        self._thread: Optional[threading.Thread] = None

    def watch(self, device: Hashable) -> float:
        """Starts probing ``device``, which failed (again).

        Returns:
          The wait before its first probe: ``first_s``, doubled for each
          failure since it last ran ``stable_s`` without failing.
        """
        with self._cond:
            if self._closed:
                return 0.0
            now = time.monotonic()
            back = self._back_at.pop(device, None)
            if back is not None and now - back >= self.policy.stable_s:
                self._strikes.pop(device, None)
            strikes = self._strikes[device] = self._strikes.get(device, 0) + 1
            wait = self.policy.first_wait(strikes)
            self._due[device] = (now + wait, wait)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="edgecap-prober", daemon=True)
                self._thread.start()
            self._cond.notify()
            return wait

    def strikes(self, device: Hashable) -> int:
        """Failures of ``device`` in a row: none of them a stable period after it was taken back."""
        with self._cond:
            return self._strikes.get(device, 0)

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
                        self._back_at[device] = time.monotonic()
                    else:
                        _, backoff = self._due[device]
                        backoff = min(2 * backoff, self.policy.max_s)
                        self._due[device] = (time.monotonic() + backoff, backoff)
                if back:
                    self._on_return(device)
