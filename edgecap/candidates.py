"""Candidate plans: the other plans a running board may switch to, and their price under corrections.

A board cannot run edgetpu_compiler, so ``edgecap compile --into-bundle``
writes, beside each board's best plan, a few other plans compiled ahead
(``plans/<board>/candidates/<name>/plan.json``: other cuts and TPU orders,
each the best when some device runs slower or faster than its profile, or
when fewer TPUs are attached). The running board measures its stages, fits a
``Correction`` per device, and re-chooses: ``load_candidates`` gives the
plans it may choose from, ``price`` what each would take under the
corrections. Both read only the bundle and each stage's ``cost`` (what its
prediction is made of, docs/plan.md); neither needs the compiler.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from edgecap.bundle import Bundle, WindowSpec
from edgecap.errors import ConfigError, EdgecapError, PlanError
from edgecap.plan import Plan, Stage, load_plan
from edgecap.windows import windows_per_frame

_log = logging.getLogger("edgecap")

# The device whose corrections price CPU work inside any stage: the RNN steps
# of the CPU stage and the ops edgetpu_compiler left on the CPU in a TPU stage.
CPU = "cpu"


@dataclass(frozen=True)
class Correction:
    """How one device (or one shared bus) differs from the profile the plans were priced with.

    Attributes:
      compute_scale: Factor on the device's compute and invoke milliseconds:
        2.0 is a device running at half the profile's speed (a throttled
        TPU), 0.5 one twice as fast.
      link_bytes_per_s: The link rate measured for the device (or, keyed by
        a bus name, the bus's rate), replacing the profile's; None keeps it.

    Raises:
      ConfigError: If ``compute_scale`` or ``link_bytes_per_s`` is not a
        positive finite number.
    """

    compute_scale: float = 1.0
    link_bytes_per_s: Optional[float] = None

    def __post_init__(self) -> None:
        if not _positive(self.compute_scale):
            raise ConfigError(f"Correction compute_scale {self.compute_scale!r}: use a positive "
                              "finite factor (1.0 = as the profile)")
        if self.link_bytes_per_s is not None and not _positive(self.link_bytes_per_s):
            raise ConfigError(f"Correction link_bytes_per_s {self.link_bytes_per_s!r}: use a positive "
                              "finite rate in bytes per second, or None to keep the profile's")


def _positive(value: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and value > 0


@dataclass(frozen=True)
class CandidatePlans:
    """A board's candidate plans, loaded once: those usable for a window, and those skipped.

    Attributes:
      usable: ``(name, plan)`` of each usable candidate, in the compiler's rank order.
      skipped: ``(name, why)`` of the others.
    """

    usable: Tuple[Tuple[str, Plan], ...] = ()
    skipped: Tuple[Tuple[str, str], ...] = ()


def plan_unusable(plan: Plan, bundle: Bundle, window: WindowSpec) -> Optional[str]:
    """Says why a plan in the bundle cannot run this window of it, or returns None.

    A plan compiled from another encoder does not fit; one that charges its
    CPU stage for another number of RNN steps a frame (another frames/stride)
    is timed wrong. The best plans (``edgecap.planner.bundle_plans``) and the
    candidates are checked alike.
    """
    steps = windows_per_frame(window.frames, window.stride)
    if plan.model_sha256 != bundle.encoder_model.sha256:
        return "compiled from another encoder"
    if not np.isclose(plan.rnn_steps_per_frame, steps):
        return (f"made for {plan.rnn_steps_per_frame:g} RNN steps a frame, this "
                f"window ({window.frames} frames, stride {window.stride}) takes {steps:g}")
    return None


def scan_candidates(bundle: Bundle, board: str, window: WindowSpec) -> CandidatePlans:
    """Loads a board's candidate plans and sorts them into usable and skipped.

    The checks are those of the best plans (``plan_unusable``): the plan must read (``load_plan``: every segment present and the file it
    recorded), be made for ``board``, from the bundle's encoder, and charge
    the RNN steps a frame this window takes.

    Args:
      bundle: The loaded bundle (``Bundle.candidates`` lists the directories).
      board: The board profile name (``plans/<board>/``).
      window: The window the captioner runs.

    Returns:
      ``CandidatePlans``: ``usable`` as ``(name, plan)`` in the order the
      compiler ranked them, ``skipped`` as ``(name, why)``.
    """
    usable: List[Tuple[str, Plan]] = []
    skipped: List[Tuple[str, str]] = []
    for directory in bundle.candidates.get(board, ()):
        name = f"{board}/{directory.name}"
        try:
            plan = load_plan(directory)
        except EdgecapError as exc:
            skipped.append((name, f"unreadable ({exc})"))
            continue
        why = (f"made for board {plan.board!r}, not {board!r}" if plan.board != board
               else plan_unusable(plan, bundle, window))
        if why is None:
            usable.append((name, plan))
        else:
            skipped.append((name, why))
    return CandidatePlans(tuple(usable), tuple(skipped))


def load_candidates(bundle: Bundle, board: str, window: WindowSpec) -> List[Plan]:
    """Returns the candidate plans of a board that can run this window, best-ranked first.

    The board's best plan (``plans/<board>/plan.json``) is not among them: it
    is ``bundle.plans[board]``. A candidate may leave TPUs idle (an empty
    stage) or be made for fewer TPUs than the board has (``Plan.board_tpus``):
    what it needs attached is the devices of its ``active_stages``. Each
    skipped candidate is logged once with its reason (``scan_candidates``
    returns them).

    Args:
      bundle: The loaded bundle.
      board: The board profile name.
      window: The window the captioner runs.

    Returns:
      The usable plans, in the order the compiler ranked them.
    """
    found = scan_candidates(bundle, board, window)
    for name, why in found.skipped:
        _log.warning("candidate plan %s skipped: %s", name, why)
    return [plan for _, plan in found.usable]


def plan_files(plan: Plan) -> List[Path]:
    """Returns the files a plan read from disk is made of: plan.json, segments, compiled segments."""
    paths = [] if plan.path is None else [plan.path]
    for stage in plan.stages:
        paths += [p for p in (stage.segment, stage.compiled_segment) if p is not None]
    return paths


def _correction(corrections: Mapping[str, Correction], key: str) -> Correction:
    return corrections.get(key) or Correction()


def stage_ms(stage: Stage, corrections: Mapping[str, Correction]) -> float:
    """Returns one stage's milliseconds per invoke under the corrections.

    ``compute_ms + invoke_ms`` scale with the stage device's ``compute_scale``;
    ``extra_ms`` (CPU work: the RNN steps, ops left on the CPU in a TPU stage)
    with the ``cpu`` correction's; ``link_bytes`` go at the device's corrected
    link rate. A stage without ``cost`` (an older plan) scales its
    ``predicted_ms`` by its device's ``compute_scale``; an empty stage takes 0.

    Args:
      stage: A stage of a plan.
      corrections: Device string (``stage.device``, e.g. ``usb:0``, ``cpu``)
        to its ``Correction``; a device not named runs as its profile says.

    Returns:
      Milliseconds.

    Raises:
      PlanError: If the stage has neither ``cost`` nor ``predicted_ms``.
    """
    if stage.empty:
        return 0.0
    own = _correction(corrections, stage.device)
    cost = stage.cost
    if cost is None:
        if stage.predicted_ms is None:
            raise PlanError(f"stages[{stage.index}] on {stage.device} has no predicted time to "
                            "re-price; re-run `edgecap compile`")
        return stage.predicted_ms * own.compute_scale
    link_ms = 0.0
    if cost.link_bytes:
        rate = own.link_bytes_per_s or cost.link_bytes_per_s
        # A link with no rate recorded has none to correct: the prediction's share stays.
        link_ms = cost.link_bytes * 1e3 / rate if rate else cost.link_ms
    return ((cost.compute_ms + cost.invoke_ms) * own.compute_scale + link_ms
            + cost.extra_ms * _correction(corrections, CPU).compute_scale)


def bus_ms(plan: Plan, corrections: Mapping[str, Correction]) -> Dict[str, float]:
    """Returns each shared bus's milliseconds per frame: the link bytes of its stages at its rate.

    Args:
      plan: The plan.
      corrections: As for ``price``; a ``Correction`` keyed by a bus's name
        replaces that bus's rate.

    Returns:
      Bus name to milliseconds.
    """
    out = {}
    for bus in plan.buses:
        rate = _correction(corrections, bus.name).link_bytes_per_s or bus.bytes_per_s
        moved = sum(s.cost.link_bytes for s in plan.active_stages
                    if s.cost is not None and s.cost.bus == bus.name)
        out[bus.name] = moved * 1e3 / rate
    return out


def price(plan: Plan, corrections: Mapping[str, Correction]) -> float:
    """Returns a plan's period in milliseconds per frame under per-device corrections.

    The period is the slowest of its stages (``stage_ms``) and of its shared
    buses (``bus_ms``: the link bytes of every stage behind one bus share its
    rate); ``1e3 / price`` is the frames per second it sustains. With no
    corrections it is the compiler's ``predicted.bottleneck_ms``.

    Args:
      plan: A plan with predictions (``edgecap compile``'s).
      corrections: Device string (``stage.device``: ``pci:0``, ``usb:1``,
        ``cpu``, ...) or bus name to its ``Correction``; anything not named
        runs as its profile says.

    Returns:
      Milliseconds per frame; lower is better.

    Raises:
      PlanError: If a stage has neither ``cost`` nor ``predicted_ms``.
    """
    times = [stage_ms(s, corrections) for s in plan.active_stages]
    return max(times + list(bus_ms(plan, corrections).values()))
