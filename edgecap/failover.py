"""Device failover: a new plan for the devices left, and re-probing the failed ones.

When an EdgeTPU fails mid-stream the captioner asks ``replan`` for the plan
to go on with on the board's TPUs that still answer (``board_tpus``: those
the plan left idle included), trying in turn:

1. the best plan the bundle carries for the running plan's board
   (``plans/<board>/``) that needs no more TPUs than are left (most TPUs,
   then the fastest predicted bottleneck);
2. re-partitioning in-process for the board with the TPUs left, when the
   compiler is installed (``edgecap.planning``, the runtime's one door to it);
3. the plan as it was, with each failed device's stage on a CPU worker of
   its own (``cpu:1``, ``cpu:2``, ...).

A ``Prober`` thread probes each failed device again with exponential
backoff (``PROBE_FIRST_S`` doubling up to ``PROBE_MAX_S``) and reports it
when it answers, so the captioner can re-plan onto every device again.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from edgecap import devices, faults
from edgecap.autoplan import tpus_used
from edgecap.bundle import Bundle, WindowSpec
from edgecap.errors import EdgecapError
from edgecap.placement import Placement, place
from edgecap.plan import Plan, load_plan, single_cpu_plan
from edgecap.windows import windows_per_frame

PROBE_FIRST_S = 0.25
PROBE_MAX_S = 30.0
TPU_KINDS = ("tpu", "emu-tpu")

_log = logging.getLogger("edgecap")


@dataclass(frozen=True)
class Replan:
    """What ``replan`` chose.

    Attributes:
      plan: The plan to run.
      placement: Its stages' workers.
      how: ``bundle``, ``compiler`` or ``cpu`` (see the module docstring).
    """

    plan: Plan
    placement: Placement
    how: str


def describe(plan: Plan, workers: Mapping[str, str]) -> str:
    """One line of a plan's stages and the workers they run on, e.g. ``tpu:0@emu-tpu:0 cpu@cpu``."""
    return " ".join(f"{s.device}@{workers.get(s.device, s.device)}" for s in plan.active_stages)


def tpu_workers(placement: Placement) -> List[str]:
    """The workers of a placement that are EdgeTPUs (real or emulated), in pipeline order."""
    return [w for w in placement.workers.values() if devices.parse_device(w).kind in TPU_KINDS]


def board_tpus(plan: Plan, placement: Placement) -> List[str]:
    """The EdgeTPUs a failover may move onto: the placement's, then the board's others.

    A plan need not use every TPU of its board (the demo's ``devboard-usb``
    plan leaves the USB accelerator idle); when a TPU it uses fails, an idle
    one is a better place than the CPU.

    Args:
      plan: The running plan (``board_tpus``: the TPUs of its board).
      placement: Its placement.

    Returns:
      Device strings, the placement's TPU workers first: for real EdgeTPUs,
      then the other attached ones (``tpu:N``); for emulated ones, then
      ``emu-tpu:N`` up to the plan's ``board_tpus`` (a plan compiled with
      ``--tpus`` below the board's records that many: its board's other TPUs
      are not known here, and the runtime does not open the compiler's
      board profiles outside ``edgecap.planning``).
    """
    used = tpu_workers(placement)
    if any(devices.parse_device(w).kind == "tpu" for w in used):
        taken = {devices.parse_device(w) for w in used}
        extra, per_bus = [], {}
        for info in devices.list_devices():
            if info.kind not in ("pci", "usb"):
                continue
            i = per_bus[info.kind] = per_bus.get(info.kind, -1) + 1
            # The same device by either name: tpu:N in enumeration order, or its bus and index there.
            names = {devices.parse_device(info.device), devices.DeviceSpec("tpu", i, info.kind)}
            if i == 0:
                names.add(devices.DeviceSpec("tpu", None, info.kind))  # "pci": the first on that bus
            if not names & taken:
                extra.append(info.device)
        return used + extra
    others = [f"emu-tpu:{i}" for i in range(plan.board_tpus or 0)]
    return used + [d for d in others if d not in used]


def replan(bundle: Bundle, plan: Plan, placement: Placement, left: Sequence[str],
           failed: Sequence[str], board: Optional[str], emulate: Optional[bool],
           candidates: Optional[Sequence[Plan]] = None,
           window: Optional[WindowSpec] = None) -> Replan:
    """Chooses the plan to go on with on the EdgeTPUs left.

    Args:
      bundle: The loaded bundle (its plans, its encoder).
      plan: The plan that was running.
      placement: Its placement.
      left: The EdgeTPU workers that still answer (device strings, in order).
      failed: The EdgeTPU workers that do not.
      board: The board profile to re-partition for, or None (no compiler rung).
      emulate: As ``CaptionerOptions.emulate``.
      candidates: The bundle's plans for the running plan's board, loaded
        (``bundle_plans``); None loads them here.
      window: The window the captioner runs, which a re-partition plans for
        (default: the bundle's).

    Returns:
      The ``Replan``.
    """
    if candidates is None:
        candidates = bundle_plans(bundle, plan)
    real = any(devices.parse_device(w).kind == "tpu" for w in left)
    if window is not None:  # a bundled plan charged its CPU stage for the bundle's window
        steps = windows_per_frame(window.frames, window.stride)
        candidates = [c for c in candidates if c.rnn_steps_per_frame == steps]
    fitting = [c for c in candidates if tpus_used(c) <= len(left)
               and not (real and any(s.spec.kind == "tpu" and s.compiled_segment is None
                                     for s in c.active_stages))]
    if fitting:
        best = max(fitting, key=lambda c: (tpus_used(c), -_bottleneck(c)))
        return Replan(best, _onto(best, left, emulate), "bundle")
    if board:
        from edgecap.planning import plan_for_board  # the one door to the compiler

        try:
            planned = (plan_for_board(bundle, board, tpus=len(left), window=window) if left
                       else single_cpu_plan(bundle.encoder_model))
            return Replan(planned, _onto(planned, left, emulate), "compiler")
        except EdgecapError as exc:  # not installed, or the board refused
            _log.warning("edgecap: re-partitioning for %s failed (%s); failed stages go to the CPU",
                         board, exc)
    overrides: Dict[str, str] = {}
    spare = 1
    for stage in plan.active_stages:
        worker = placement.workers[stage.device]
        if worker in failed:
            overrides[stage.device] = f"cpu:{spare}"
            spare += 1
        else:
            overrides[stage.device] = worker
    return Replan(plan, place(plan, emulate, overrides, 0), "cpu")


def bundle_plans(bundle: Bundle, plan: Plan) -> List[Plan]:
    """The plans the bundle carries for the running plan's board, loaded and checked once.

    Only the same board's: another board's plan is timed for other devices
    (and, on a real board, compiled for TPUs it may not have). Loading
    re-reads and hashes every segment, so the captioner keeps the list.

    Args:
      bundle: The loaded bundle.
      plan: The running plan (its ``board``).

    Returns:
      The plans of ``bundle.plans`` made for ``plan.board`` from the bundle's
      encoder; none when the plan names no board.
    """
    found: List[Plan] = []
    if not plan.board:
        return found
    for directory in bundle.plans.values():
        try:
            candidate = load_plan(directory)
        except EdgecapError:
            continue
        if candidate.board == plan.board and candidate.model_sha256 == bundle.encoder_model.sha256:
            found.append(candidate)
    return found


def _onto(plan: Plan, left: Sequence[str], emulate: Optional[bool]) -> Placement:
    """Places ``plan`` with its TPU stages, in order, on the TPUs left."""
    tpus = [s.spec for s in plan.active_stages if s.spec.kind == "tpu"]
    overrides = {str(spec): left[i] for i, spec in enumerate(dict.fromkeys(tpus))}
    return place(plan, emulate, overrides, len(left))


def _bottleneck(plan: Plan) -> float:
    return plan.predicted.bottleneck_ms if plan.predicted else float("inf")


def answers(device: str) -> bool:
    """Whether a failed device answers a probe now.

    An emulated EdgeTPU answers unless an injected fault keeps it away
    (``faults.current().answers``); a real one when libedgetpu's delegate
    opens on it again (probed in a child process first, see
    ``stages.load_edgetpu_delegate``).
    """
    spec = devices.parse_device(device)
    if not faults.current().answers(device):
        return False
    if spec.kind != "tpu":
        return True
    from edgecap import stages  # opens libedgetpu: only for real devices

    try:
        stages.load_edgetpu_delegate(spec)
    except EdgecapError:
        return False
    return True


class Prober:
    """Probes failed devices again with exponential backoff, on one thread of its own.

    Args:
      on_return: Called (on the prober's thread) with a device that answers again.
      probe: ``device -> bool`` (default ``answers``).
    """

    def __init__(self, on_return: Callable[[str], None], probe: Callable[[str], bool] = answers) -> None:
        self._on_return = on_return
        self._probe = probe
        self._cond = threading.Condition()
        self._due: Dict[str, Tuple[float, float]] = {}  # device -> (next probe, backoff)
        self._closed = False
        self._thread: Optional[threading.Thread] = None

    def watch(self, device: str) -> None:
        """Starts probing ``device`` (again, from the shortest backoff)."""
        with self._cond:
            if self._closed:
                return
            self._due[device] = (time.monotonic() + PROBE_FIRST_S, PROBE_FIRST_S)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="edgecap-prober", daemon=True)
                self._thread.start()
            self._cond.notify()

    def forget(self, device: str) -> None:
        """Stops probing ``device``."""
        with self._cond:
            self._due.pop(device, None)

    @property
    def watched(self) -> List[str]:
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
