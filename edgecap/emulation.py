"""The hidden truth emulated devices obey: how the board really differs from its profile.

An emulated EdgeTPU paces each invoke to its stage's cost (``edgecap.stages``).
``$EDGECAP_EMULATE`` makes the emulated board differ from the profile the
planner priced it with, so that a runtime which measures and re-plans has
something to find::

    EDGECAP_EMULATE="emu-tpu:1=speed:0.5;emu-tpu:0=link:usb2;emu-tpu:0=throttle:60s"

Entries are ``DEVICE=KEY:VALUE``, separated by ``;`` (several keys of one
device may also be joined by ``,``):

* ``DEVICE``: ``emu-tpu:N`` (the run's N-th emulated EdgeTPU, as workers and
  ``$EDGECAP_FAULTS`` name them: the running plan's TPUs in pipeline order),
  a board TPU as plans name it (``pci:N``, ``usb:N``, ``tpu:N``: that TPU
  whichever plan runs), or ``cpu`` (the board's CPU: its paced stage, the
  RNN step, and the ops edgetpu_compiler left on it inside a TPU stage).
* ``speed:F``: the device computes F times as fast as its profile says
  (0.5: half as fast); its compute and invoke time take 1/F as long.
* ``link:KIND``: its link is a ``KIND`` link of ``edgecap/data/links.json``
  (``pcie``, ``pcie3``, ``usb3``, ``usb2``) and moves bytes at that kind's
  usable rate.
* ``throttle:Ts``: thermal throttling: T seconds after the device's first
  paced invoke, its clock halves for good.

Only the emulated devices' pacing reads it; the planner and the compiler never
do (the truth is what they must find out). Pacing also shares each plan bus
(``Plan.buses``) between the stages whose links sit behind it, on one clock
per bus (``BusClock``), with or without a truth. ``resolve`` names a truth's
devices as plans do; ``Truth.corrections`` says it in the terms a plan is
priced in (``edgecap.plans.pricing``), and ``steady_fps`` is the fps a plan
settles at under it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
from dataclasses import dataclass, replace
from typing import Dict, Iterator, Optional, Tuple

from edgecap.devices import DeviceSpec, parse_device
from edgecap.errors import ConfigError, PlanError
from edgecap.links import link_kinds
from edgecap.limits import MAX_EMULATED_SPEED, MAX_THROTTLE_S, MIN_EMULATED_SPEED
from edgecap.plans.plan import Bus, Plan, Stage
from edgecap.plans.pricing import Correction, invoke_ms, price

ENV = "EDGECAP_EMULATE"
GRAMMAR = ("write DEVICE=KEY:VALUE entries separated by ';', DEVICE one of cpu, emu-tpu:N, pci:N, "
           "usb:N, tpu:N and KEY:VALUE one of speed:F, link:KIND, throttle:Ts, "
           "e.g. emu-tpu:1=speed:0.5;emu-tpu:0=link:usb2;emu-tpu:0=throttle:60s")
# A throttled device runs at this fraction of its clock (the "halves the clock").
THROTTLED = 0.5

_SETTING = re.compile(r"^(speed|link|throttle):(.+)$")
_SECONDS = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)s?$")


def link_rates() -> Dict[str, float]:
    """The usable rate of each link kind, bytes per second (``edgecap.links``).

    Raises:
      ConfigError: If the file is missing or malformed.
    """
    return {name: kind.usable_bytes_per_s for name, kind in link_kinds().items()}


@dataclass(frozen=True)
class DeviceTruth:
    """How one emulated device really behaves.

    Attributes:
      speed: Compute speed relative to the profile (0.5: half as fast).
      link: The link kind it really sits behind, or None (the plan's).
      throttle_after_s: Seconds after its first paced invoke when its clock
        halves; None: never.
    """

    speed: float = 1.0
    link: Optional[str] = None
    throttle_after_s: Optional[float] = None

    def speed_at(self, elapsed_s: float) -> float:
        """The compute speed ``elapsed_s`` seconds after the device's first paced invoke."""
        if self.throttle_after_s is not None and elapsed_s >= self.throttle_after_s:
            return self.speed * THROTTLED
        return self.speed

    @property
    def steady_speed(self) -> float:
        """The speed it settles at (throttled, if it throttles)."""
        return self.speed * (THROTTLED if self.throttle_after_s is not None else 1.0)

    @property
    def link_bytes_per_s(self) -> Optional[float]:
        """Its true link rate, or None where the truth keeps the plan's."""
        return None if self.link is None else link_rates()[self.link]

    def __str__(self) -> str:
        parts = [] if self.speed == 1.0 else [f"speed:{self.speed:g}"]
        if self.link is not None:
            parts.append(f"link:{self.link}")
        if self.throttle_after_s is not None:
            parts.append(f"throttle:{self.throttle_after_s:g}s")
        return ",".join(parts) or "speed:1"


@dataclass(frozen=True)
class Truth:
    """The emulated board's truth: each named device's ``DeviceTruth`` (canonical device strings)."""

    devices: Tuple[Tuple[str, DeviceTruth], ...] = ()

    def get(self, device: "str | DeviceSpec") -> Optional[DeviceTruth]:
        """The truth of ``device``, or None where it behaves as profiled."""
        return dict(self.devices).get(str(device))

    def __bool__(self) -> bool:
        return bool(self.devices)

    def corrections(self) -> Dict[str, Correction]:
        """Each named device as it settles (throttled, if it throttles), as plans are priced: its ``Correction``."""
        return {device: Correction(part.steady_speed, part.link_bytes_per_s) for device, part in self.devices}

    def __str__(self) -> str:
        """The spec, as ``$EDGECAP_EMULATE`` takes it (``parse(str(t)) == t``)."""
        return ";".join(f"{device}={truth}" for device, truth in self.devices)


def _bad(source: str, part: str, why: str) -> ConfigError:
    return ConfigError(f"{source}: {part!r} {why}; {GRAMMAR}")


def _setting(truth: DeviceTruth, key: str, value: str, source: str, part: str) -> DeviceTruth:
    if key == "speed":
        try:
            speed = float(value)
        except ValueError:
            speed = float("nan")
        if not MIN_EMULATED_SPEED <= speed <= MAX_EMULATED_SPEED:  # NaN fails too
            raise _bad(source, part, f"has no speed factor in [{MIN_EMULATED_SPEED:g}, {MAX_EMULATED_SPEED:g}]")
        return replace(truth, speed=speed)
    if key == "link":
        kinds = link_rates()
        if value not in kinds:
            raise _bad(source, part, f"names no link kind of edgecap/data/links.json ({', '.join(kinds)})")
        return replace(truth, link=value)
    m = _SECONDS.match(value)
    if m is None or float(m[1]) > MAX_THROTTLE_S:
        raise _bad(source, part, f"has no throttle time in seconds (0 to {MAX_THROTTLE_S:g}, e.g. 60s)")
    return replace(truth, throttle_after_s=float(m[1]))


def parse(text: str, source: str = ENV) -> Truth:
    """Parses a truth spec.

    Args:
      text: ``DEVICE=KEY:VALUE`` entries separated by ``;`` (blank: none).
      source: Where the text came from, for messages.

    Returns:
      The ``Truth``, devices in the order first named.

    Raises:
      ConfigError: One line naming ``source``, the bad part and the grammar.
    """
    found: Dict[str, DeviceTruth] = {}
    keys_seen = set()
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        device, sep, settings = entry.partition("=")
        if not sep or not settings.strip():
            raise _bad(source, entry, "is not DEVICE=KEY:VALUE")
        try:
            spec = parse_device(device.strip())
        except ConfigError:
            raise _bad(source, entry, f"names no device ({device.strip()!r})") from None
        if spec.kind != "cpu" and spec.index is None:
            raise _bad(source, entry, "names no single EdgeTPU (add its number, e.g. usb:0)")
        name = str(spec)
        truth = found.get(name, DeviceTruth())
        for part in (p.strip() for p in settings.split(",")):
            m = _SETTING.match(part)
            if m is None:
                raise _bad(source, part, "is not speed:F, link:KIND or throttle:Ts")
            key, value = m[1], m[2].strip()
            if (name, key) in keys_seen:
                raise _bad(source, entry, f"sets {key} of {name} twice")
            if key == "link" and spec.kind == "cpu":
                raise _bad(source, entry, "gives the CPU a link (it shares the host's memory)")
            keys_seen.add((name, key))
            truth = _setting(truth, key, value, source, part)
        found[name] = truth
    return Truth(tuple(found.items()))


@functools.lru_cache(maxsize=8)
def _parsed(text: str) -> Truth:
    return parse(text, ENV)


def current() -> Truth:
    """The process's truth: ``$EDGECAP_EMULATE``'s as it reads now (empty when unset).

    Raises:
      ConfigError: If the variable is malformed.
    """
    return _parsed(os.environ.get(ENV, ""))


def resolve(truth: Truth, plan: Plan, source: str = ENV) -> Truth:
    """Names each device of ``truth`` as plans do, so it stays with its TPU whichever plan runs.

    ``emu-tpu:N`` is ``plan``'s N-th TPU stage that runs operators, in
    pipeline order (as the run's workers are numbered), then its TPU stages
    that run none, in order.

    Args:
      truth: The truth.
      plan: The plan the emulated run starts with.
      source: Where the truth came from, for messages.

    Returns:
      The truth with ``emu-tpu:N`` replaced by ``pci:N`` / ``usb:N`` / ``tpu:N``.

    Raises:
      ConfigError: If it names an ``emu-tpu:N`` the plan's board lacks, or
        sets one setting of a TPU twice under two names.
    """
    tpus = [s for s in plan.stages if s.spec.kind == "tpu"]
    order = [s.device for s in tpus if not s.empty] + [s.device for s in tpus if s.empty]
    parts = []
    for device, part in truth.devices:
        spec = parse_device(device)
        if spec.kind == "emu-tpu":
            if spec.index >= len(order):
                raise ConfigError(f"{source}: {device} is no EdgeTPU of this run (its plan has "
                                  f"{len(order)}: emu-tpu:0 to emu-tpu:{len(order) - 1}); name one of them")
            device = order[spec.index]
        parts.append(f"{device}={part}")
    return parse(";".join(parts), source)


@contextlib.contextmanager
def emulating(truth: Truth) -> Iterator[Truth]:
    """Sets ``$EDGECAP_EMULATE`` to ``truth`` for the block (worker processes started in it inherit it).

    Every device's throttle clock starts again (a new board, cool).
    """
    before = os.environ.get(ENV)
    os.environ[ENV] = str(truth)
    with _state_lock:
        _origins.clear()
    try:
        yield truth
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


class BusClock:
    """One shared bus's timeline: when it is busy until, lock-protected.

    Each invoke's link bytes take ``bytes / bytes_per_s`` of bus time at the
    first moment the bus is free, so stages behind one bus together never move
    more than its rate, as on a board.
    """

    def __init__(self, bytes_per_s: float) -> None:
        self.bytes_per_s = bytes_per_s
        self._busy_until = 0.0
        self._lock = threading.Lock()

    def reserve(self, start: float, nbytes: float) -> float:
        """Books ``nbytes`` from ``start`` (``time.perf_counter`` seconds) on; returns when they are through."""
        with self._lock:
            begin = max(start, self._busy_until)
            self._busy_until = begin + nbytes / self.bytes_per_s
            return self._busy_until


_buses: Dict[Tuple[str, float], BusClock] = {}
_origins: Dict[str, float] = {}
_state_lock = threading.Lock()


def bus_clock(bus: Bus) -> BusClock:
    """The process's clock of ``bus`` (one per name and rate, shared by every stage on it)."""
    with _state_lock:
        return _buses.setdefault((bus.name, bus.bytes_per_s), BusClock(bus.bytes_per_s))


def speed_now(truth: DeviceTruth, device: str, now: float) -> float:
    """``truth``'s speed of ``device`` at ``now`` (``time.perf_counter``).

    The throttle's clock starts at the device's first paced invoke in this
    process, the first call for it.
    """
    with _state_lock:
        origin = _origins.setdefault(device, now)
    return truth.speed_at(now - origin)


class Pace:
    """When an emulated stage's invoke ends, under the truth and its bus.

    Args:
      stage: The plan stage.
      worker: The device it runs on (``emu-tpu:N``, or ``cpu`` for the CPU stage).
      pace_ms: Its pace as profiled: normally ``predicted_ms``; a pace
        other than ``cost``'s total scales every part of it alike.
      truth: The truth to pace by.
      bus: The shared bus its link sits behind, or None.
    """

    def __init__(self, stage: Stage, worker: DeviceSpec, pace_ms: float, truth: Truth,
                 bus: Optional[Bus] = None) -> None:
        self._pace_s = pace_ms / 1e3
        self._cost = stage.cost if worker.kind == "emu-tpu" else None
        if worker.kind == "emu-tpu":
            key = str(worker) if truth.get(worker) is not None else str(stage.spec)
        else:
            key = "cpu"  # the board has one CPU, whichever worker thread runs its stage
        self._key = key
        self._device = truth.get(key) or DeviceTruth()
        self._cpu = truth.get("cpu") or DeviceTruth()
        cost = self._cost
        self._scale = 0.0
        if cost is not None and cost.total_ms > 0:
            self._scale = pace_ms / cost.total_ms
        self._bus = bus_clock(bus) if bus is not None and cost is not None and cost.link_bytes else None

    def _parts(self, speed: float, cpu_speed: float) -> Tuple[float, float, float]:
        """``(link bytes, link seconds, compute seconds)`` of one invoke at these speeds."""
        cost = self._cost
        if cost is None or self._scale == 0.0:
            # Older plans say no more than predicted_ms: all of it scales with the clock.
            return 0.0, 0.0, self._pace_s / speed
        link_ms, work_ms = invoke_ms(cost, speed, cpu_speed, self._device.link_bytes_per_s)
        return cost.link_bytes * self._scale, self._scale * link_ms / 1e3, self._scale * work_ms / 1e3

    def deadline(self, start: float) -> float:
        """The ``time.perf_counter()`` at which an invoke begun at ``start`` ends (books its bus time)."""
        nbytes, link_s, compute_s = self._parts(speed_now(self._device, self._key, start),
                                                speed_now(self._cpu, "cpu", start))
        link_end = start + link_s
        if self._bus is not None:
            link_end = max(link_end, self._bus.reserve(start, nbytes))
        return link_end + compute_s


def steady_fps(plan: Plan, truth: Truth) -> Optional[float]:
    """The fps ``plan`` settles at on its emulated board under ``truth`` (*modelled*).

    Its price (``edgecap.plans.pricing.price``) with every device at the
    speed and link rate it settles at (``Truth.corrections``): the slowest of
    its stages, the CPU's RNN steps and its buses.

    Args:
      plan: A plan whose stages predict their time.
      truth: The truth (an ``emu-tpu:N`` is ``plan``'s, as ``resolve`` names it).

    Returns:
      The fps, or None where a stage predicts no time.
    """
    try:
        return price(plan, resolve(truth, plan).corrections()).fps
    except PlanError:
        return None


def pace(stage: Stage, worker: DeviceSpec, pace_ms: float, bus: Optional[Bus] = None) -> Optional[Pace]:
    """The truth's pace of an emulated stage, or None where it is plainly ``pace_ms``.

    Args:
      stage: The plan stage.
      worker: Its device: an ``emu-tpu:N``, or ``cpu`` for an emulated board's CPU stage.
      pace_ms: Its pace as profiled.
      bus: The plan bus its link shares, if any.

    Returns:
      A ``Pace``, or None when neither the truth nor a bus changes the pace.

    Raises:
      ConfigError: If ``$EDGECAP_EMULATE`` is malformed.
    """
    truth = current()
    if worker.kind == "emu-tpu":
        cpu_work = stage.cost is not None and stage.cost.extra_ms > 0  # ops left on the CPU
        named = truth.get(worker) or truth.get(stage.spec) or (truth.get("cpu") if cpu_work else None)
        shared = bus is not None and stage.cost is not None and stage.cost.link_bytes > 0
        if named is None and not shared:
            return None
    elif worker.kind != "cpu" or truth.get("cpu") is None:
        return None
    return Pace(stage, worker, pace_ms, truth, bus)
