"""The plans a bundle carries: each board's best plan and its candidates, loaded and checked once.

A board cannot run edgetpu_compiler, so ``edgecap compile --into-bundle``
writes, per board, the best plan (``plans/<board>/plan.json``) and a few
other plans compiled ahead (``plans/<board>/candidates/<name>/plan.json``:
other cuts and TPU orders, each the best when some device runs slower or
faster than its profile, or when fewer TPUs are attached). ``bundle_plans``
is the one loader of both, and ``BundlePlans`` the one record: the plans that
can run the captioner's window, and why each other one cannot. Which of them
runs is the planner's (``edgecap.planner``); what each costs on the board as
measured, ``edgecap.plans.pricing``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import numpy as np

from edgecap.bundle import Bundle, WindowSpec
from edgecap.errors import EdgecapError
from edgecap.plans.plan import Plan, load_plan
from edgecap.windows import windows_per_frame


@dataclass(frozen=True)
class BundlePlans:
    """A bundle's plans, loaded once: those usable for a window, and those skipped.

    Attributes:
      usable: ``(name, plan)`` of each usable plan: a board's best plan is
        named by its folder (``devboard-usb``), a candidate by its board and
        folder (``devboard-usb/01-2tpu-...``); best plans first, candidates in
        the compiler's rank order.
      skipped: ``(name, why)`` of the others.
    """

    usable: Tuple[Tuple[str, Plan], ...] = ()
    skipped: Tuple[Tuple[str, str], ...] = ()


def bundle_plans(bundle: Bundle, window: WindowSpec, board: Optional[str] = None, *,
                 best: bool = True, candidates: bool = False) -> BundlePlans:
    """Loads the bundle's plans and keeps those that can run this window.

    A plan must read (``load_plan``: every segment present and the file it
    recorded), be compiled from the bundle's encoder, and charge its CPU stage
    the RNN steps a frame this window takes (``plan_unusable``); a candidate
    must also be made for the board whose folder holds it.

    Args:
      bundle: The loaded bundle (``Bundle.plans``, ``Bundle.candidates``).
      window: The window the captioner runs.
      board: Only plans made for this board profile (None: every board's).
      best: Load each board's best plan (``plans/<board>/plan.json``).
      candidates: Load the boards' candidate plans.

    Returns:
      The ``BundlePlans``.
    """
    usable: List[Tuple[str, Plan]] = []
    skipped: List[Tuple[str, str]] = []
    for name, plan, why in _checked(bundle, window, board, best, candidates):
        if why is None:
            usable.append((name, plan))
        else:
            skipped.append((name, why))
    return BundlePlans(tuple(usable), tuple(skipped))


def _checked(bundle: Bundle, window: WindowSpec, board: Optional[str], best: bool,
             candidates: bool) -> Iterator[Tuple[str, Optional[Plan], Optional[str]]]:
    """``(name, plan, why it is unusable or None)`` of each plan asked for, in order."""
    if best:
        for name, directory in bundle.plans.items():
            plan, why = _read(directory)
            if plan is not None and board is not None and plan.board != board:
                continue  # another board's best plan: not asked for
            yield name, plan, why or plan_unusable(plan, bundle, window)
    if candidates:
        for owner in ([board] if board is not None else sorted(bundle.candidates)):
            for directory in bundle.candidates.get(owner, ()):
                plan, why = _read(directory)
                if why is None and plan.board != owner:
                    why = f"made for board {plan.board!r}, not {owner!r}"
                yield f"{owner}/{directory.name}", plan, why or plan_unusable(plan, bundle, window)


def _read(directory: Path) -> Tuple[Optional[Plan], Optional[str]]:
    try:
        return load_plan(directory), None
    except EdgecapError as exc:
        return None, f"unreadable ({exc})"


def plan_unusable(plan: Plan, bundle: Bundle, window: WindowSpec) -> Optional[str]:
    """Says why a plan in the bundle cannot run this window of it, or returns None.

    A plan compiled from another encoder does not fit; one that charges its
    CPU stage for another number of RNN steps a frame (another frames/stride)
    is timed wrong.
    """
    steps = windows_per_frame(window.frames, window.stride)
    if plan.model_sha256 != bundle.encoder_model.sha256:
        return "compiled from another encoder"
    if not np.isclose(plan.rnn_steps_per_frame, steps):
        return (f"made for {plan.rnn_steps_per_frame:g} RNN steps a frame, this "
                f"window ({window.frames} frames, stride {window.stride}) takes {steps:g}")
    return None


def plan_files(plan: Plan) -> List[Path]:
    """Returns the files a plan read from disk is made of: plan.json, segments, compiled segments."""
    paths = [] if plan.path is None else [plan.path]
    for stage in plan.stages:
        paths += [p for p in (stage.segment, stage.compiled_segment) if p is not None]
    return paths
