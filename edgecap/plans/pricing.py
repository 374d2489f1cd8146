"""A plan's price: its period and latency a frame on a board that may differ from its profile.

Each stage of a plan records what its predicted time is made of
(``CostParts``: compute, the fixed invoke cost, bytes over its link, and work
left to the CPU: the RNN encoder steps of the CPU stage, the ops
edgetpu_compiler did not map inside a TPU stage). ``price`` re-prices those
parts under a ``Correction`` per device: how fast it computes against its
profile (``speed``: above 1 faster, 0.5 half as fast) and the rate its link,
or a shared bus, really moves bytes at. One function answers for a board

* as profiled (no corrections): the compiler's own prediction;
* as corrected by measurement (``edgecap.adapt``): what the running board,
  and the compiler ranking the plans a bundle carries, choose by;
* as an emulated truth (``edgecap.emulation``): the fps a plan settles at;
  each emulated invoke is paced by the per-stage part, ``invoke_ms``, at the
  truth's speed of that instant.

The period is the slowest of: each stage's time an invoke; the CPU's RNN
steps a frame where its stage runs no operators (the CPU runs them anyway);
each shared bus's bytes a frame at its rate. A stage run as K copies
(``Stage.replicas``) holds each of its devices for that copy's share of the
frames, so with shares in proportion to speed it sustains ``sum(1 / t_i)``
frames a millisecond; a device's stages add up (the CPU's copy of the whole
model and its RNN steps), and so do a bus's bytes. The board CPU's own work a
frame (``Plan.cpu_frame``: preprocessing, and a hand-off per stage a frame
passes) adds to the CPU's load whatever the plan. The latency is the sum of
the stages' times, a replicated stage's its slowest copy's, and that own work.

This module imports only ``edgecap.errors`` and the plan records
(``edgecap.plans.plan``), so the runtime, the emulation and the compiler can all use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Dict, Mapping, Optional, Tuple

from edgecap.errors import ConfigError, PlanError
from edgecap.plans.plan import CostParts, Plan, Prediction, Stage

# The device whose correction prices CPU work inside any stage: the RNN steps
# of the CPU stage and the ops edgetpu_compiler left on the CPU in a TPU stage.
CPU = "cpu"


@dataclass(frozen=True)
class Correction:
    """How one device, or one shared bus, runs against the profile its plans were priced with.

    Attributes:
      speed: How fast the device computes against its profile: 2.0 twice as
        fast, 0.5 half as fast (a throttled TPU). Its compute and invoke
        time take ``1 / speed`` as long.
      link_bytes_per_s: The rate its link (or, keyed by a bus's name, the
        bus) really moves bytes at, replacing the profile's; None keeps it.

    Raises:
      ConfigError: If ``speed`` or ``link_bytes_per_s`` is not a positive finite number.
    """

    speed: float = 1.0
    link_bytes_per_s: Optional[float] = None

    def __post_init__(self) -> None:
        if not _positive(self.speed):
            raise ConfigError(f"Correction speed {self.speed!r}: use a positive finite factor "
                              "(1.0 = as the profile, 0.5 = half as fast)")
        if self.link_bytes_per_s is not None and not _positive(self.link_bytes_per_s):
            raise ConfigError(f"Correction link_bytes_per_s {self.link_bytes_per_s!r}: use a positive "
                              "finite rate in bytes per second, or None to keep the profile's")


def _positive(value: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and value > 0


Corrections = Mapping[str, Correction]
AS_PROFILED: Corrections = MappingProxyType({})
_NONE = Correction()


@dataclass(frozen=True)
class CopyPrice:
    """What one more copy of a replicated stage takes under the corrections.

    Attributes:
      device: Its plan device.
      ms: Milliseconds an invoke there, its link's bytes included.
      share: The fraction of frames it takes.
      link_bytes: Bytes over its link an invoke.
      bus: The shared bus its link sits behind, or None.
    """

    device: str
    ms: float
    share: float
    link_bytes: int = 0
    bus: Optional[str] = None


@dataclass(frozen=True)
class StagePrice:
    """What one stage takes under the corrections.

    Attributes:
      index: The stage's index in its plan.
      device: Its plan device (``pci:0``, ``cpu``).
      ms: Milliseconds an invoke, its link's bytes included.
      link_bytes: Bytes over its link an invoke.
      bus: The shared bus its link sits behind, or None.
      share: The fraction of frames ``device`` takes (1 without replicas).
      replicas: The stage's other copies (``Stage.replicas``), each with its share.
    """

    index: int
    device: str
    ms: float
    link_bytes: int = 0
    bus: Optional[str] = None
    share: float = 1.0
    replicas: Tuple[CopyPrice, ...] = ()

    # ``Price`` reads a stage only through the five below. A stage of K copies
    # dealt frames by share holds each device ``share * ms`` a frame: with
    # shares in proportion to speed (1 / ms) that is ``1 / sum(1 / ms_i)``
    # for every copy, the K copies together sustaining ``sum(1 / ms_i)``
    # frames a millisecond; each frame still passes one copy, so its latency
    # is the slowest copy's and the bus carries each copy's bytes for its share.

    @property
    def _copies(self) -> Tuple[CopyPrice, ...]:
        return (CopyPrice(self.device, self.ms, self.share, self.link_bytes, self.bus), *self.replicas)

    @property
    def period_ms(self) -> float:
        """How long the stage holds its busiest device a frame (one device: an invoke)."""
        if not self.replicas:
            return self.ms
        return max(c.share * c.ms for c in self._copies)

    @property
    def latency_ms(self) -> float:
        """How long a frame takes to pass the stage (replicated: through its slowest copy)."""
        if not self.replicas:
            return self.ms
        return max(c.ms for c in self._copies)

    def bus_bytes(self, bus: str) -> float:
        """Bytes a frame the stage moves over the shared bus ``bus``."""
        return sum(c.share * c.link_bytes for c in self._copies if c.bus == bus)

    def device_ms(self, device: str) -> float:
        """Milliseconds an invoke of the stage takes on ``device`` (0 where it does not run there)."""
        return sum(c.ms for c in self._copies if c.device == device)

    def load_ms(self, device: str) -> float:
        """Milliseconds a frame the stage takes of ``device``: its share of the frames, each an invoke."""
        return sum(c.share * c.ms for c in self._copies if c.device == device)


@dataclass(frozen=True)
class Price:
    """A plan's price under the corrections.

    Attributes:
      stages: Each stage that takes time, in pipeline order: those that run
        operators, and the CPU's where it runs only the RNN steps.
      buses: ``(name, ms)`` of each shared bus: its stages' link bytes a frame at its rate.
      cpu_frame_ms: The board CPU's own work a frame (``Plan.cpu_frame``:
        preprocessing, a hand-off per stage): a load on the CPU and time every frame spends.
    """

    stages: Tuple[StagePrice, ...]
    buses: Tuple[Tuple[str, float], ...] = ()
    cpu_frame_ms: float = 0.0

    def _loads(self) -> Dict[str, float]:
        # Each device's load a frame: what all its stages take of it, and the CPU's own work.
        devices = {c.device for s in self.stages for c in s._copies}
        loads = {d: sum(s.load_ms(d) for s in self.stages) for d in devices}
        if self.cpu_frame_ms:
            loads[CPU] = loads.get(CPU, 0.0) + self.cpu_frame_ms
        return loads

    @property
    def period_ms(self) -> float:
        """Milliseconds a frame the pipeline sustains: its slowest stage, device or bus.

        A device's load is what all its stages take of it a frame: the CPU's
        RNN steps, its copy of a replicated stage and its own work a frame add up.
        """
        return max([s.period_ms for s in self.stages] + list(self._loads().values())
                   + [ms for _, ms in self.buses], default=0.0)

    @property
    def serial_ms(self) -> float:
        """Milliseconds a frame when nothing overlaps (the sequential path): each stage's copies by share, and the CPU's own work."""
        return sum(c.share * c.ms for s in self.stages for c in s._copies) + self.cpu_frame_ms

    @property
    def fps(self) -> Optional[float]:
        """Frames a second it sustains, or None for a plan that takes no time."""
        period = self.period_ms
        return 1e3 / period if period > 0 else None

    @property
    def latency_ms(self) -> float:
        """Milliseconds a frame spends passing every stage, and the CPU's own work on it."""
        return sum(s.latency_ms for s in self.stages) + self.cpu_frame_ms

    @property
    def bottleneck_stage(self) -> int:
        """The stage that sets the period: the slowest; where a bus does, the one moving most bytes
        over it; where the CPU's load does, the last stage on the CPU."""
        if not self.stages:
            return 0
        slowest = max(self.stages, key=lambda s: s.period_ms)
        bus, bus_ms = max(self.buses, key=lambda b: b[1], default=(None, 0.0))
        cpu_ms = self._loads().get(CPU, 0.0)
        if bus is not None and bus_ms > max(slowest.period_ms, *self._loads().values()):
            slowest = max(self.stages, key=lambda s: s.bus_bytes(bus))
        elif self.cpu_frame_ms and cpu_ms > max(slowest.period_ms, bus_ms):
            slowest = ([s for s in self.stages if s.load_ms(CPU) > 0 or s.device == CPU] or [slowest])[-1]
        return slowest.index

    def device_ms(self, device: str) -> float:
        """Milliseconds of a plan device's invokes a frame it runs (the CPU's: with its RNN steps)."""
        return sum(s.device_ms(device) for s in self.stages)

    def prediction(self) -> Prediction:
        """The plan's ``Prediction`` (plan.json ``predicted``) at this price."""
        period = self.period_ms
        return Prediction(fps=round(1e3 / period, 2) if period else None,
                          latency_ms=round(self.latency_ms, 6), bottleneck_ms=round(period, 6),
                          bottleneck_stage=self.bottleneck_stage)


def price(plan: Plan, corrections: Corrections = AS_PROFILED) -> Price:
    """Prices a plan a frame under per-device corrections: the one function for a plan's period and latency.

    Args:
      plan: A plan whose stages predict their time (``edgecap compile``'s;
        an older plan's stage without cost parts scales its whole time by its
        device's speed).
      corrections: Plan device (``pci:0``, ``usb:1``, ``cpu``) or bus name to
        its ``Correction``; anything not named runs as its profile says.

    Returns:
      The ``Price``: ``period_ms`` (lower is better; ``fps``), ``latency_ms``
      and each stage's and bus's share.

    Raises:
      PlanError: If a stage that runs operators has neither cost parts nor a predicted time.
    """
    stages = [stage_price(s, corrections) for s in plan.stages if not s.empty]
    rnn = _rnn_steps(plan, corrections)
    if rnn is not None:
        stages.append(rnn)
    buses = []
    for bus in plan.buses:
        rate = corrections.get(bus.name, _NONE).link_bytes_per_s or bus.bytes_per_s
        moved = sum(s.bus_bytes(bus.name) for s in stages)
        buses.append((bus.name, moved * 1e3 / rate))
    # Every frame passes each stage once (one copy of a replicated one): a hand-off each.
    own = 0.0 if plan.cpu_frame is None else plan.cpu_frame.ms(len(stages)) / corrections.get(CPU, _NONE).speed
    return Price(tuple(stages), tuple(buses), own)


def stage_price(stage: Stage, corrections: Corrections = AS_PROFILED) -> StagePrice:
    """Prices one stage's invoke under the corrections (``price``'s part for a stage).

    Raises:
      PlanError: If the stage has neither cost parts nor a predicted time.
    """
    first, *others = [_copy_price(c, corrections) for c in stage.copies]
    return StagePrice(stage.index, first.device, first.ms, first.link_bytes, first.bus, first.share,
                      tuple(others))


def _copy_price(stage: Stage, corrections: Corrections) -> CopyPrice:
    own = corrections.get(stage.device, _NONE)
    cost = stage.cost
    if cost is None:
        if stage.predicted_ms is None:
            raise PlanError(f"stages[{stage.index}] on {stage.device} has no predicted time to "
                            "re-price; re-run `edgecap compile`")
        return CopyPrice(stage.device, stage.predicted_ms / own.speed, stage.share)
    link_ms, work_ms = invoke_ms(cost, own.speed, corrections.get(CPU, _NONE).speed, own.link_bytes_per_s)
    return CopyPrice(stage.device, link_ms + work_ms, stage.share, cost.link_bytes, cost.bus)


def invoke_ms(cost: CostParts, speed: float = 1.0, cpu_speed: float = 1.0,
              link_bytes_per_s: Optional[float] = None) -> Tuple[float, float]:
    """Returns ``(link_ms, work_ms)`` of one invoke of a stage made of ``cost``.

    Args:
      cost: The stage's cost parts, as profiled.
      speed: Its device's speed against the profile: compute and invoke take ``1 / speed``.
      cpu_speed: The CPU's: the work left to it (``extra_ms``) takes ``1 / cpu_speed``.
      link_bytes_per_s: The link's true rate; None: the rate the prediction
        used (none recorded: the link costs nothing).

    Returns:
      Milliseconds on the link and of work.
    """
    rate = link_bytes_per_s or cost.link_bytes_per_s
    link_ms = cost.link_bytes * 1e3 / rate if cost.link_bytes and rate else 0.0
    return link_ms, (cost.compute_ms + cost.invoke_ms) / speed + cost.extra_ms / cpu_speed


def _rnn_steps(plan: Plan, corrections: Corrections) -> Optional[StagePrice]:
    """The CPU's RNN steps a frame where its stage runs no operators, or None where that stage prices them."""
    cpu = next((s for s in plan.stages if s.spec.kind == "cpu"), None)
    if cpu is not None and not cpu.empty:
        return None
    speed = corrections.get(CPU, _NONE).speed
    if cpu is not None and cpu.cost is not None:
        return StagePrice(cpu.index, CPU, sum(invoke_ms(cpu.cost, speed, speed)))
    if cpu is not None and cpu.predicted_ms is not None:
        return StagePrice(cpu.index, CPU, cpu.predicted_ms / speed)
    if cpu is None and not plan.rnn_ms:
        return None
    return StagePrice(len(plan.stages) if cpu is None else cpu.index, CPU, plan.rnn_frame_ms / speed)
