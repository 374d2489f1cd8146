"""Fault injection: makes chosen devices fail, hang, vanish or crash at chosen invokes.

For testing failover with emulated TPUs. A fault plan is a comma-separated
list of ``DEVICE=ACTION@N[+Ss]`` entries, taken from ``$EDGECAP_FAULTS`` or
given to ``inject()``::

    EDGECAP_FAULTS="emu-tpu:1=fail@120+2s,emu-tpu:0=hang@300" edgecap caption clip.mp4

* ``DEVICE``: an EdgeTPU as plans and ``--devices`` write it (``tpu:N``,
  ``pci:N``, ``usb:N``, ``emu-tpu:N``): faults strike EdgeTPU invokes only,
  so an entry for the CPU is refused, and so is one for an EdgeTPU the
  running board lacks (``check``), when a captioner starts.
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
from typing import Dict, List, Optional, Sequence

from edgecap.devices import DeviceSpec, parse_device
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

    def __str__(self) -> str:
        back = "" if self.back_after_s is None else f"+{self.back_after_s:g}s"
        return f"{self.device}={self.action}@{self.at}{back}"


def parse(text: str, source: str = ENV) -> List[Fault]:
    """Parses a fault plan.

    Args:
      text: ``DEVICE=ACTION@N[+Ss]`` entries, comma-separated (blank: none).
      source: Where the text came from, for messages.

    Returns:
      The faults, in the order given.

    Raises:
      ConfigError: One line naming the bad entry and the expected form, or
        why it can never fire (a device that is no EdgeTPU).
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
        try:
            spec = parse_device(m["device"])
        except ConfigError as exc:
            raise ConfigError(f"{source}: fault {entry!r}: {exc}") from None
        if spec.kind == "cpu":
            raise ConfigError(f"{source}: fault {entry!r} can never fire: faults strike EdgeTPU invokes "
                              f"and {m['device']} is the CPU; name an EdgeTPU (tpu:N, emu-tpu:N)")
        back = float(m["back"]) if m["back"] is not None else None
        # The canonical string: the one a stage's worker is named by (emu-tpu:01 is emu-tpu:1).
        faults.append(Fault(str(spec), m["action"], int(m["at"]), back))
    return faults


class FaultPlan:
    """The faults of this process, and each device's invoke count; thread-safe."""

    def __init__(self, faults: List[Fault], source: str = ENV) -> None:
        self._pending = list(faults)
        self._source = source
        self._counts: Dict[str, int] = {}
        self._gone_until: Dict[str, float] = {}
        self._lock = threading.Lock()
        # Set by release_hangs(): lets an emulated hang end when its pipeline
        # is closed, so tests and the soak leak no thread (a real one would).
        self.released = threading.Event()

    def __bool__(self) -> bool:
        return bool(self._pending)

    @property
    def pending(self) -> List[Fault]:
        """The faults not yet fired, in the order given."""
        with self._lock:
            return list(self._pending)

    def add(self, fault: Fault) -> None:
        """Adds a fault, keeping those pending and every device's absence (the soak's way in).

        Its ``at`` counts from 0 over the device's life: ``invokes(device)``
        is the device's next invoke.
        """
        with self._lock:
            self._pending.append(fault)

    def withdraw(self, fault: Fault) -> bool:
        """Removes a fault that has not fired; False if it fired already."""
        with self._lock:
            if fault in self._pending:
                self._pending.remove(fault)
                return True
            return False

    def invokes(self, device: str) -> int:
        """Invokes of ``device`` counted so far."""
        with self._lock:
            return self._counts.get(device, 0)

    def check(self, tpus: Sequence[DeviceSpec]) -> None:
        """Refuses a pending fault on a device that is not one of ``tpus`` (it can never fire).

        Args:
          tpus: The EdgeTPUs a run may use: the plan's and those it may fail over onto.

        Raises:
          ConfigError: One line naming the first such entry, and the EdgeTPUs there are.
        """
        names = [str(d) for d in tpus]
        for fault in self.pending:
            if fault.device not in names:
                have = f"its EdgeTPUs are {', '.join(names)}" if names else "it runs on no EdgeTPU"
                raise ConfigError(f"{self._source}: fault {str(fault)!r} can never fire: this run's board "
                                  f"has no {fault.device} ({have}); name one of them")

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
            _plan = FaultPlan(parse(os.environ.get(ENV, "")), ENV)
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
    plan = FaultPlan(parse(text, "inject()"), "inject()")
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
