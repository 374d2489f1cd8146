"""Fault injection: makes chosen devices fail, hang, vanish or crash at chosen invokes.

For testing failover with emulated TPUs. A fault plan is a comma-separated
list of ``DEVICE=ACTION@N[+Ss]`` entries, taken from ``$EDGECAP_FAULTS`` or
given to ``inject()``::

    EDGECAP_FAULTS="emu-tpu:1=fail@120+2s,emu-tpu:0=hang@300" edgecap caption clip.mp4

* ``DEVICE``: a device string as plans and ``--devices`` write it.
* ``ACTION``: ``fail`` (the invoke raises), ``hang`` (it never returns),
  ``vanish`` (the invoke raises and the device is gone from the bus),
  ``abort`` (the process running the invoke calls ``os.abort()``, as
  libedgetpu does on a USB transfer error) or ``segv`` (it segfaults).
* ``N``: the device's invoke, counted from 0 over the life of the process,
  at which the fault fires; each entry fires once.
* ``+Ss``: the device answers probes again ``S`` seconds after the fault
  (default: never), so re-probing can take it back.

``abort`` and ``segv`` kill the process that runs the invoke: use them with
stages isolated in worker processes.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

from edgecap.errors import ConfigError, DeviceFailed

ENV = "EDGECAP_FAULTS"
ACTIONS = ("fail", "hang", "vanish", "abort", "segv")
_ENTRY = re.compile(r"^(?P<device>[^=\s]+)=(?P<action>[a-z]+)@(?P<at>\d+)(?:\+(?P<back>\d+(?:\.\d+)?)s)?$")


@dataclass(frozen=True)
class Fault:
    """One injected fault.

    Attributes:
      device: The device it strikes.
      action: One of ``ACTIONS``.
      at: The device's invoke (0-based) at which it fires.
      back_after_s: Seconds after firing when the device answers probes again;
        None for never.
    """

    device: str
    action: str
    at: int
    back_after_s: Optional[float] = None


def parse(text: str, source: str = ENV) -> List[Fault]:
    """Parses a fault plan.

    Args:
      text: ``DEVICE=ACTION@N[+Ss]`` entries, comma-separated (blank: none).
      source: Where the text came from, for messages.

    Returns:
      The faults, in the order given.

    Raises:
      ConfigError: One line naming the bad entry and the expected form.
    """
    faults = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        m = _ENTRY.match(entry)
        if m is None or m["action"] not in ACTIONS:
            raise ConfigError(
                f"{source}: bad fault {entry!r}; write DEVICE=ACTION@N[+Ss] with ACTION one of "
                f"{', '.join(ACTIONS)}, e.g. emu-tpu:1=fail@120+2s"
            )
        back = float(m["back"]) if m["back"] is not None else None
        faults.append(Fault(m["device"], m["action"], int(m["at"]), back))
    return faults


class FaultPlan:
    """The faults of this process, and each device's invoke count; thread-safe."""

    def __init__(self, faults: List[Fault]) -> None:
        self._pending = list(faults)
        self._counts: Dict[str, int] = {}
        self._gone_until: Dict[str, float] = {}
        self._lock = threading.Lock()
        # Set by release_hangs(): lets an emulated hang end when its pipeline
        # is closed, so tests and the soak leak no thread (a real one would).
        self.released = threading.Event()

    def __bool__(self) -> bool:
        return bool(self._pending)

    def take(self, device: str) -> Optional[Fault]:
        """Counts one invoke of ``device``; returns the fault that fires at it, if any."""
        with self._lock:
            n = self._counts.get(device, 0)
            self._counts[device] = n + 1
            for i, fault in enumerate(self._pending):
                if fault.device == device and fault.at <= n:
                    del self._pending[i]
                    back = fault.back_after_s
                    self._gone_until[device] = time.monotonic() + back if back is not None else float("inf")
                    return fault
        return None

    def crashes(self, device: str) -> bool:
        """Whether a pending fault of ``device`` kills the process running its invoke (abort, segv)."""
        with self._lock:
            return any(f.device == device and f.action in ("abort", "segv") for f in self._pending)

    def answers(self, device: str) -> bool:
        """Whether an emulated ``device`` answers a probe now (False while an injected fault lasts)."""
        with self._lock:
            return time.monotonic() >= self._gone_until.get(device, 0.0)


_plan: Optional[FaultPlan] = None
_plan_lock = threading.Lock()


def current() -> FaultPlan:
    """The process's fault plan: ``inject()``'s, else ``$EDGECAP_FAULTS``'s (read once)."""
    global _plan
    with _plan_lock:
        if _plan is None:
            _plan = FaultPlan(parse(os.environ.get(ENV, "")))
        return _plan


def inject(text: str) -> FaultPlan:
    """Replaces the process's fault plan (the test API); ``inject("")`` clears it.

    Args:
      text: As ``$EDGECAP_FAULTS`` takes it.

    Returns:
      The new plan.

    Raises:
      ConfigError: If an entry is malformed.
    """
    global _plan
    plan = FaultPlan(parse(text, "inject()"))
    with _plan_lock:
        if _plan is not None:
            _plan.released.set()
        _plan = plan
    return plan


def perform(fault: Fault, released: Optional[threading.Event] = None) -> None:
    """Does what ``fault`` says, in the calling thread (or worker process).

    Args:
      fault: The fault that fired.
      released: For ``hang``: an event that ends the hang (default: the
        current plan's ``released``); a real hung driver call has none.

    Raises:
      DeviceFailed: For ``fail`` and ``vanish``; for ``hang`` once released.
    """
    if fault.action == "abort":
        os.abort()
    if fault.action == "segv":
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    if fault.action == "hang":
        (released or current().released).wait()
        raise DeviceFailed(fault.device, "hung", f"injected hang at invoke {fault.at} released")
    kind = "vanished" if fault.action == "vanish" else "error"
    raise DeviceFailed(fault.device, kind, f"injected {fault.action} at invoke {fault.at}")
