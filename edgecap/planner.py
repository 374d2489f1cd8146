"""The one place that decides what runs where: which plan, on which workers, and how each stage runs.

Two moments ask for a decision, and both answer with a ``Choice``:

* ``choose`` at start: the plan given (a plan.json or a ``Plan``), the
  compiler's plan for a named board profile (``edgecap.plans.compiler``, the
  runtime's one door to the compiler), or with ``board="auto"`` the bundle's
  compiled plan for the attached EdgeTPUs, else the whole encoder on the CPU;
  on a CPU-only run the host rule (``host_schedule``) decides how the cores
  are used;
* ``choose_after`` when a device fails or comes back: the bundle's best plan
  for the TPUs left, else a re-partition by the compiler when it is
  installed, else the failed stages on CPU workers of their own;
* ``choose_measured`` when the running board measures its devices off the
  model (``edgecap.adapt``): the plan best under the learned corrections,
  among the bundle's plans for the board and a re-partition by the compiler.

All read the bundle's plans through one loader and filter
(``edgecap.plans.bundled.bundle_plans``): a plan compiled from another
encoder, or charged for another window than the one running, is skipped and
the reason kept; plans are compared by their price
(``edgecap.plans.pricing``). A
``Choice`` holds, per CNN stage, everything about running it (``StageRun``:
worker, threads, pacing, isolation, deadlines), so the captioner opens what
it says and decides nothing itself.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from edgecap import adapt, devices, faults, isolation
from edgecap.bundle import Bundle, WindowSpec
from edgecap.devices import DeviceSpec, Hardware, parse_device
from edgecap.errors import BundleError, ConfigError, EdgecapError, PlanError
from edgecap.failover import load_recovery
from edgecap.modelfile import open_model
from edgecap.options import FIRST_INVOKE_GRACE, CaptionerOptions
from edgecap.plans import compiled_encoder
from edgecap.plans.bundled import BundlePlans, bundle_plans
from edgecap.plans.plan import Bus, Plan, Stage, check_segments, load_plan, single_cpu_plan
from edgecap.plans.pricing import Corrections, price
from edgecap.scheduler import FEEDER
from edgecap.windows import windows_per_frame

# Kinds of worker that are EdgeTPUs: a real one, or one emulated on the CPU.
TPU_KINDS = ("tpu", "emu-tpu")
CPU = DeviceSpec("cpu")
DECODE_WORKER = "decode"
# Frames are resized and quantized on their own worker, not on the thread that
# reads (decodes) the source: on a multi-core board the two overlap.
PREPROCESS_WORKER = "preprocess"
# The deadline of a TPU stage whose plan predicts no time for it (a segment
# compiled elsewhere): long enough for any segment that streams its weights.
UNPREDICTED_DEADLINE_S = 2.0
# Below this CNN invoke time (one thread, measured) kernel threads cost more
# than they save: the host rule keeps the CNN on one, and overlaps only decoding.
SUB_MS_CNN = 1.0
# A hand-off (a put and the wake-up of the thread blocked on it) costs tens of
# microseconds, and a thread another process preempts stalls the one it feeds
# once the queue between them is full: the host rule hands a file's frames over
# in batches carrying about this much CNN and RNN work, at most HOST_BATCH_MAX
# frames (the demo on this shared host: docs/runtime.md).
HOST_BATCH_MS = 1.0
HOST_BATCH_MAX = 16
# How often a running host CNN on several kernel threads re-checks the cores
# other processes take (edgecap.cpu_load), and by how much the cores left must
# differ from its threads before it changes them (so a load near half a core
# does not flip it at each look).
HOST_RECHECK_S = 1.0
HOST_RECHECK_MARGIN = 0.6
# A change of kernel threads is tried on this many frames, and kept if they ran faster by
# HOST_KEEP_MARGIN (an 8-frame median on a shared host moves by more than a few percent);
# the other count (one thread, or every core) is tried at least this often whatever the load says.
HOST_TRIAL_FRAMES = 8
HOST_KEEP_MARGIN = 0.1
HOST_EXPLORE_S = 5.0
# measure_host times each model for about this long (at most this many invokes).
MEASURE_HOST_S = 0.02
MEASURE_HOST_MAX = 50

_log = logging.getLogger("edgecap")


@dataclass(frozen=True)
class StageRun:
    """How one CNN stage of a plan runs.

    Attributes:
      stage: The plan stage.
      worker: The device whose worker thread runs it (``emu-tpu:0``, ``cpu:1``, ``tpu:0``, ``cpu``).
      threads: Threads of its interpreter's kernels (at start).
      recheck: The host schedule whose kernel threads the stage re-checks
        while it runs (``host_threads``), or None: they stay ``threads``.
      pace_ms: Every invoke takes at least this long (an emulated EdgeTPU, or
        the CPU stage of an emulated board); None runs unpaced.
      compute: False: a timing-only paced stage computes nothing (zeros out).
      isolate: Run it in a worker process (``edgecap.isolation``).
      deadline_s: Seconds an invoke may take before the device counts as
        hung (the watchdog's, and an isolated worker's kill); None: no watch.
      first_deadline_s: The first invoke's deadline (a delegate loads the
        segment's parameters then).
      bus: The plan bus the stage's link shares (``cost.bus``), or None; an
        emulated stage paces its link bytes on that bus's clock.
      copy: Which copy of a replicated stage it is (``Stage.copies``; 0: the
        stage's own device, or a stage without replicas): ``stage`` is that copy.
      share: The fraction of frames it takes (the dealer's weight).
    """

    stage: Stage
    worker: DeviceSpec
    threads: int = 1
    recheck: Optional["HostSchedule"] = None
    pace_ms: Optional[float] = None
    compute: bool = True
    isolate: bool = False
    deadline_s: Optional[float] = None
    first_deadline_s: Optional[float] = None
    bus: Optional[Bus] = None
    copy: int = 0
    share: float = 1.0

    @property
    def name(self) -> str:
        """The step's name in statistics and traces, e.g. ``stage 0 (tpu:0)``."""
        return f"stage {self.stage.index} ({self.stage.device})"


@dataclass(frozen=True)
class HostSchedule:
    """How a CPU-only run uses this machine's cores (``host_schedule``).

    On more than one core, frames are decoded and preprocessed on the
    pipeline's feeder thread, beside the models (``scheduler.FEEDER``).

    Attributes:
      kind: ``sequential`` (one core: one thread does everything, the CNN's
        interpreter on one kernel thread), ``overlap`` (the CNN on one kernel
        thread and the RNN after it on the ``cpu`` worker), ``threads`` (the
        same with every core to the CNN's interpreter, re-checked while it
        runs: ``host_threads``) or ``pipeline`` (the CNN on ``cpu:1`` with a
        core fewer, the RNN on ``cpu`` at the same time).
      num_threads: Threads of the CNN's interpreter at start.
      pipelined: Whether the steps run on worker threads (all but ``sequential``).
      cnn_worker: The CNN stage's worker.
      batch: Frames of a file handed from thread to thread at once.
      reason: One line: what was measured or predicted and compared.
      cnn_ms: The CNN's one-thread invoke the rule was given, in ms.
      rnn_ms: The RNN steps of a frame the rule was given, in ms.
      cores: The cores it planned for.
    """

    kind: str
    num_threads: int
    pipelined: bool = True
    cnn_worker: DeviceSpec = CPU
    batch: int = 1
    reason: str = ""
    cnn_ms: float = 0.0
    rnn_ms: float = 0.0
    cores: int = 1


@dataclass(frozen=True)
class Choice:
    """What runs where: the planner's answer, at start and after a failure.

    Attributes:
      plan: The plan.
      workers: Plan device (canonical string, e.g. ``tpu:0``) -> its worker.
      stages: How each active CNN stage runs, in pipeline order.
      rnn_pace_ms: The RNN encoder step's paced time (0: unpaced).
      rnn_compute: False: a timing-only board run paces the step without computing it.
      frame_pace_ms: The board CPU's own work a frame (``Plan.cpu_frame``:
        preprocessing, a hand-off per stage), paced on the RNN step's worker on
        an emulated board (0: unpaced).
      pipelined: Run each worker on its own thread (False: the sequential path).
      batch: Frames of a file source handed between workers at once.
      preprocess_worker: The worker that resizes and quantizes frames: one of
        its own (``PREPROCESS_WORKER``), or on a host the feeder, as it reads
        (``scheduler.FEEDER``).
      decode_threads: Threads a video file is decoded on (``sources.VideoFileSource``):
        None leaves it to FFmpeg; on a host one, the feeder's, beside the models.
      emulated: Whether the board is emulated (some TPU stage on ``emu-tpu``).
      how: How it was chosen: ``plan`` (given), ``board`` (compiled for a
        named board), ``auto`` (the bundle's plan for the attached hardware,
        or the CPU), ``reference`` (the float encoder), ``original`` (the
        start's, every device back), ``bundle``, ``compiler`` or ``cpu``
        (after a failure: see ``choose_after``).
      reason: One line saying why.
      board: The bundle plan's board (``auto``), else None.
      fallback: None when the plan made for this hardware runs as planned;
        otherwise a slug for metrics (``no-tpu``, ``fewer-tpus``,
        ``no-plan-for-board``, ``uncompiled``, ``bad-plan``, ``other-window``,
        ``tpu-open-failed``).
      skipped: ``(board, why)`` of each bundle plan that was not usable.
      host: The host rule's schedule on a CPU-only run it decided, else None.
    """

    plan: Plan
    workers: Mapping[str, DeviceSpec]
    stages: Tuple[StageRun, ...]
    rnn_pace_ms: float = 0.0
    rnn_compute: bool = True
    frame_pace_ms: float = 0.0
    pipelined: bool = True
    batch: int = 1
    preprocess_worker: str = PREPROCESS_WORKER
    decode_threads: Optional[int] = None
    emulated: bool = False
    how: str = "plan"
    reason: str = ""
    board: Optional[str] = None
    fallback: Optional[str] = None
    skipped: Tuple[Tuple[str, str], ...] = ()
    host: Optional[HostSchedule] = None

    @property
    def tpus(self) -> List[DeviceSpec]:
        """The EdgeTPU workers (real or emulated), in pipeline order."""
        return [s.worker for s in self.stages if s.worker.kind in TPU_KINDS]

    def describe(self) -> str:
        """One line of the plan's stages and their workers, e.g. ``tpu:0@emu-tpu:0 cpu@cpu``.

        A replicated stage's copies are joined by ``+``: ``pci:0@pci:0+usb:0@usb:0 cpu@cpu``.
        """
        words: List[str] = []
        for s in self.stages:
            word = f"{s.stage.device}@{s.worker}"
            if s.copy:
                words[-1] += f"+{word}"
            else:
                words.append(word)
        return " ".join(words)


def tpus_used(plan: Plan) -> int:
    """Returns how many distinct EdgeTPUs a plan's active stages (and their copies) run on."""
    return len(_tpu_specs(plan))


def _tpu_specs(plan: Plan) -> List[DeviceSpec]:
    """The EdgeTPUs a plan runs on, each once, in pipeline order (a stage's copies after it)."""
    return list(dict.fromkeys(d for s in plan.active_stages for d in s.devices if d.kind == "tpu"))


def _copies(plan: Plan) -> List[Tuple[int, Stage]]:
    """Every copy of every active stage, in pipeline order: ``(copy index, the stage as that copy runs it)``."""
    return [(i, c) for s in plan.active_stages for i, c in enumerate(s.copies)]


def choose(bundle: Bundle, options: CaptionerOptions, hardware: Optional[Hardware] = None) -> Choice:
    """Decides what runs where when a captioner starts.

    Args:
      bundle: The loaded bundle.
      options: The captioner's options (plan, board, emulate, devices_map, ...).
      hardware: What ``devices.detect_hardware`` found (default: detected
        here, only when ``board="auto"`` needs it).

    Returns:
      The ``Choice``.

    Raises:
      PlanError: If the plan fails validation or does not fit the bundle.
      ConfigError: If an option does not fit the plan (a ``devices_map`` key
        it does not use), or the compiler is needed and missing.
      EdgecapError: With ``on_missing_tpu="fail"``, when the bundle's plan for
        this board cannot run on the attached TPUs.
    """
    window = options.window(bundle.window)
    if options.reference_encoder:
        return _settle(bundle, options, _reference_plan(bundle), how="reference",
                       reason="the float reference encoder on the CPU")
    if options.plan is not None:
        if isinstance(options.plan, Plan):
            plan = options.plan
            check_segments(plan)  # load_plan checks a plan read from a file; this one was built in memory
        else:
            plan = load_plan(options.plan)
        _check_fits(plan, bundle)
        return _settle(bundle, options, plan, how="plan", reason=f"plan {plan.path or 'given'}")
    if options.board != "auto":
        from edgecap.plans.compiler import plan_for_board  # the one door to the compiler

        plan = plan_for_board(bundle, options.board, window=window)
        _check_fits(plan, bundle)
        return _settle(bundle, options, plan, how="board", reason=f"compiled for board {options.board}")
    hardware = hardware if hardware is not None else devices.detect_hardware()
    return _auto(bundle, options, window, hardware)


def _auto(bundle: Bundle, options: CaptionerOptions, window: WindowSpec, hardware: Hardware) -> Choice:
    """``board="auto"``: the bundle's plan for the attached hardware, else the best that runs, else the CPU.

    A fallback is one warning line.
    """
    choice = _pick_auto(bundle, options, window, hardware)
    if choice.fallback:
        _log.warning("edgecap: %s", choice.reason)
    return choice


def _pick_auto(bundle: Bundle, options: CaptionerOptions, window: WindowSpec, hardware: Hardware) -> Choice:
    attached = len(hardware.tpus)
    found = bundle_plans(bundle, window)
    usable: List[Tuple[str, Plan]] = []
    skipped = list(found.skipped)
    for board, plan in found.usable:
        why = _unfit(plan, hardware)
        if why is None:
            usable.append((board, plan))
        else:
            skipped.append((board, why))
    target = hardware.profile
    settle = dict(attached=attached, skipped=tuple(skipped))
    for board, plan in usable:
        if board == target:
            return _settle(bundle, options, plan, how="auto", board=board,
                           reason=f"plan for {board}: {_tpus(plan)} on {hardware.describe()}", **settle)
    if not bundle.plans:
        whole = compiled_encoder.encoder_plan(bundle, attached)
        on_tpu = compiled_encoder.on_tpu(whole)
        return _settle(bundle, options, whole, how="auto",
                       reason=f"the bundle carries no compiled plan; {compiled_encoder.where(whole)} "
                              f"({hardware.describe()})",
                       fallback=None if not attached or on_tpu else "no-plan-for-board", **settle)
    missing = (f"{hardware.describe()}: "
               + ("; ".join(f"plan {b}: {w}" for b, w in skipped) or f"no plan for {target or 'this board'}"))
    if options.on_missing_tpu == "fail":
        raise EdgecapError(f"{missing}; attach the TPUs the plan needs, add a plan for this board "
                           "with `edgecap compile --into-bundle`, or set on_missing_tpu = \"cpu\"")
    slug = _slug(skipped, attached)
    if usable:
        board, plan = max(usable, key=lambda bp: _rank(bp[1]))
        return _settle(bundle, options, plan, how="auto", board=board, fallback=slug,
                       reason=f"{missing}; using plan {board} ({_tpus(plan)})", **settle)
    whole = compiled_encoder.encoder_plan(bundle, attached)
    return _settle(bundle, options, whole, how="auto", fallback=slug,
                   reason=f"{missing}; {compiled_encoder.where(whole)}", **settle)


def cpu_instead(bundle: Bundle, options: CaptionerOptions, start: Choice, error: EdgecapError) -> Optional[Choice]:
    """The CPU plan for when ``auto``'s TPU plan will not open, or None where that is not wanted.

    libedgetpu missing, the device busy or not permitted: run on the CPU
    rather than not at all, with one warning line and a reason for metrics.

    Args:
      bundle: The loaded bundle.
      options: The captioner's options.
      start: The choice that failed to open.
      error: Why it failed.

    Returns:
      The CPU ``Choice``, or None unless ``start`` was auto's bundle plan and
      ``on_missing_tpu`` is ``cpu``.
    """
    if start.how != "auto" or not start.board or options.on_missing_tpu != "cpu":
        return None
    choice = _settle(bundle, options, compiled_encoder.cpu_plan(bundle), how="auto",
                     reason=f"{error}; whole encoder on the CPU", fallback="tpu-open-failed",
                     attached=0, skipped=start.skipped)
    _log.warning("edgecap: %s", choice.reason)
    return choice


def choose_after(bundle: Bundle, options: CaptionerOptions, start: Choice, failed: Sequence[DeviceSpec],
                 tpus: Sequence[DeviceSpec], candidates: BundlePlans) -> Choice:
    """Decides what runs where after devices failed (or came back), trying in turn:

    1. with no device failed, the start's choice (``original``);
    2. the bundle's best plan for the start plan's board that needs no more
       TPUs than are left (most TPUs, then the fastest predicted bottleneck),
       its TPU stages on the TPUs left in order (``bundle``);
    3. re-partitioning for that board with the TPUs left, when the compiler is
       installed (``compiler``);
    4. the start's plan with each failed device's stage on a CPU worker of its
       own, ``cpu:1``, ``cpu:2``, ... (``cpu``).

    Args:
      bundle: The loaded bundle.
      options: The captioner's options.
      start: The choice the captioner started with.
      failed: The EdgeTPU workers that do not answer.
      tpus: The board's EdgeTPUs a plan may move onto (``board_tpus``), in order.
      candidates: ``bundle_plans(bundle, window, start.plan.board)``, loaded once by the caller.

    Returns:
      The ``Choice``.
    """
    if not failed:
        return dataclasses.replace(start, how="original", reason="every device answers again")
    left = [d for d in tpus if d not in failed]
    real = any(d.kind == "tpu" for d in left)
    fitting = [plan for _, plan in candidates.usable if tpus_used(plan) <= len(left)
               and not (real and _uncompiled(plan))]
    lost = ", ".join(map(str, failed))
    if fitting:
        best = max(fitting, key=_rank)
        return _onto(bundle, options, best, left, "bundle", f"{lost} failed: the bundle's plan for "
                     f"{best.board} on {len(left)} EdgeTPU(s)")
    board = options.board if options.board != "auto" else start.board
    if board:
        from edgecap.plans.compiler import plan_for_board  # the one door to the compiler

        try:
            planned = (plan_for_board(bundle, board, tpus=len(left), window=options.window(bundle.window))
                       if left else compiled_encoder.cpu_plan(bundle))
            return _onto(bundle, options, planned, left, "compiler",
                         f"{lost} failed: re-partitioned for {board} on {len(left)} EdgeTPU(s)")
        except EdgecapError as exc:  # not installed, or the board refused
            _log.warning("edgecap: re-partitioning for %s failed (%s); failed stages go to the CPU",
                         board, exc)
    overrides: Dict[DeviceSpec, DeviceSpec] = {}
    # CPU workers of their own, after any the start runs (a copy taking whole frames has cpu:1).
    spare = 1 + max((r.worker.index or 0 for r in start.stages if r.worker.kind == "cpu"), default=0)
    for run in start.stages:
        if run.worker in failed:
            overrides[run.stage.spec] = DeviceSpec("cpu", spare)
            spare += 1
        else:
            overrides[run.stage.spec] = run.worker
    return _settle(bundle, options, start.plan, how="cpu", overrides=overrides, attached=0,
                   reason=f"{lost} failed: its stage(s) on CPU workers of their own")


def choose_measured(bundle: Bundle, options: CaptionerOptions, current: Choice,
                    corrections: Corrections, candidates: BundlePlans,
                    workers: Mapping[DeviceSpec, DeviceSpec], margin: float) -> Optional[Tuple[Choice, str]]:
    """Decides whether the board as measured runs better on another plan, and which.

    Prices, under ``corrections`` (``edgecap.plans.pricing.price``), the running
    plan, the bundle's plan and candidate plans for its board
    (``measured_plans``), and the compiler's re-partition
    for that board under the corrections (when the compiler is installed: a
    board cannot run edgetpu_compiler, but a host emulating one can).

    Args:
      bundle: The loaded bundle.
      options: The captioner's options.
      current: The running choice.
      corrections: What the board measured, by plan device.
      candidates: ``bundle_plans(bundle, window, board)`` and the board's
        candidate plans, loaded once by the caller (``measured_plans``).
      workers: Each plan device of the board (``pci:0``) -> the worker it runs
        on (the same device stays on the same worker, emulated or not).
      margin: The best plan must take this fraction less time a frame.

    Returns:
      ``(choice, why)`` of the best plan (``how`` ``measured``), or None when
      the running one is within the margin of it.
    """
    if not adapt.adaptable(current.plan):
        return None
    now = price(current.plan, corrections).period_ms
    board = current.plan.board
    offers: List[Tuple[Plan, str]] = [(plan, f"the bundle's plan {name}") for name, plan in candidates.usable
                                      if plan.board == board and adapt.adaptable(plan)]
    profile = options.board if options.board != "auto" else board
    from edgecap.plans.compiler import plan_for_board  # the one door to the compiler

    try:
        planned = plan_for_board(bundle, profile, window=options.window(bundle.window), corrections=corrections)
        offers.append((planned, f"re-partitioned for {board} under them"))
    except EdgecapError as exc:  # not installed, or the board refused: the bundle's plans only
        _log.debug("edgecap: no re-partition under the corrections (%s)", exc)
    real = any(w.kind == "tpu" for w in workers.values())
    priced = []
    for plan, why in offers:
        # A real EdgeTPU runs only what edgetpu_compiler compiled (a board's own re-partition is not).
        if (all(d in workers for d in _tpu_specs(plan))
                and not (real and _uncompiled(plan))):
            priced.append((price(plan, corrections).period_ms, plan, why))
    if not priced:
        return None
    best, plan, why = min(priced, key=lambda p: p[0])
    if best * (1.0 + margin) > now:
        return None
    overrides = {c.spec: workers[c.spec] if c.spec.kind == "tpu" else _cpu_worker(i) for i, c in _copies(plan)}
    said = (f"{why}: {1e3 / best:.1f} fps where the running plan makes {1e3 / now:.1f} "
            "under the corrections")
    choice = _settle(bundle, options, plan, how="measured", reason=said, overrides=overrides,
                     attached=sum(1 for w in set(overrides.values()) if w.kind == "tpu"),
                     board=current.board)
    return choice, said


def measured_plans(bundle: Bundle, window: WindowSpec, board: str) -> BundlePlans:
    """The bundle's plans a running board may re-choose among: its best plan for ``board``, then its candidates.

    Returns:
      ``BundlePlans`` of the usable plans (``(name, plan)``) and the skipped.
    """
    best = bundle_plans(bundle, window, board)
    others = bundle_plans(bundle, window, board, best=False, candidates=True)
    for name, why in others.skipped:
        _log.warning("candidate plan %s skipped: %s", name, why)
    return BundlePlans(best.usable + others.usable, best.skipped)


def board_tpus(choice: Choice) -> List[DeviceSpec]:
    """The EdgeTPUs a failover may move onto: the choice's, then the board's others.

    A plan need not use every TPU of its board (the demo's ``devboard-usb``
    plan leaves the USB accelerator idle); when a TPU it uses fails, an idle
    one is a better place than the CPU.

    Args:
      choice: The running choice.

    Returns:
      The choice's TPU workers first; then, for real EdgeTPUs, the other
      attached ones by bus and index (``usb:N``, ``pci:N``); for emulated ones, ``emu-tpu:N`` up to the
      plan's ``board_tpus`` (a plan compiled with ``--tpus`` below the
      board's records that many).
    """
    used = choice.tpus
    if any(w.kind == "tpu" for w in used):
        taken = set(used)
        extra, per_bus = [], {}
        for info in devices.list_devices():
            if info.kind not in ("pci", "usb"):
                continue
            i = per_bus[info.kind] = per_bus.get(info.kind, -1) + 1
            # The same device by either name: tpu:N in enumeration order, or its bus and index there.
            spec = DeviceSpec("tpu", i, info.kind)  # a spare opens as usb:N / pci:N, not a bare :N
            names = {parse_device(info.device), spec}
            if i == 0:
                names.add(DeviceSpec("tpu", None, info.kind))  # "pci": the first on that bus
            if not names & taken:
                extra.append(spec)
        return used + extra
    others = [DeviceSpec("emu-tpu", i) for i in range(choice.plan.board_tpus or 0)]
    return used + [d for d in others if d not in used]


def host_schedule(cnn_ms: float, rnn_ms: float, cores: int, source: str = "measured") -> HostSchedule:
    """The host rule: how a CPU-only run uses ``cores`` cores.

    * One core: ``sequential``, nothing to overlap.
    * Otherwise decoding (on one thread) and preprocessing always run on the
      feeder thread, beside the models' worker: a file's frames are handed
      over in batches of about ``HOST_BATCH_MS`` of model work
      (``HOST_BATCH_MAX`` frames at most), so a hand-off costs little however
      small the CNN and a preempted thread does not stall the other at once
      (against plain loops on this host: docs/runtime.md).
    * A CNN under ``SUB_MS_CNN`` on one thread: ``overlap``, the CNN on one
      kernel thread: on so little work kernel threads cost more than they save.
    * Otherwise, with the CNN taking ``t`` ms a frame on all cores (taken as
      ``cnn_ms / cores``: linear scaling, the best case for threads) and the
      RNN ``r`` ms a frame: ``threads`` takes ``t + r`` a frame, ``pipeline``
      ``max(t * C / (C - 1), r)``, so pipelining pays only when ``r > t / (C - 1)``.
      ``threads`` re-checks its kernel threads while it runs (``host_threads``).

    Args:
      cnn_ms: The CNN's invoke time on one thread, in ms.
      rnn_ms: The RNN encoder steps of one frame, in ms.
      cores: The physical cores to use.
      source: Where the times came from (``measured``, ``predicted``), for the reason.

    Returns:
      The ``HostSchedule``.
    """
    cores = max(1, cores)
    said = f"CNN {cnn_ms:.2f} ms on one thread, RNN {rnn_ms:.2f} ms a frame ({source})"
    times = dict(cnn_ms=cnn_ms, rnn_ms=rnn_ms, cores=cores)
    if cores == 1:
        return HostSchedule("sequential", 1, pipelined=False, reason=f"{said}; one core: nothing to overlap",
                            **times)
    frame_ms = cnn_ms + rnn_ms
    batch = max(1, min(HOST_BATCH_MAX, math.ceil(HOST_BATCH_MS / frame_ms))) if frame_ms > 0 else HOST_BATCH_MAX
    handed = f"decoding beside it, {batch} frame{'s' if batch > 1 else ''} a hand-off"
    if cnn_ms < SUB_MS_CNN:
        return HostSchedule("overlap", 1, batch=batch, **times,
                            reason=f"{said}; under {SUB_MS_CNN:g} ms: one kernel thread, {handed}")
    t = cnn_ms / cores
    pipelined = max(t * cores / (cores - 1), rnn_ms)
    compared = (f"{said}: threads {t + rnn_ms:.2f} ms, pipeline {pipelined:.2f} ms a frame on {cores} cores; "
                f"{handed}")
    if rnn_ms > t / (cores - 1):
        return HostSchedule("pipeline", cores - 1, cnn_worker=DeviceSpec("cpu", 1), batch=batch,
                            reason=compared, **times)
    return HostSchedule("threads", cores, batch=batch, reason=compared, **times)


def host_threads(schedule: HostSchedule, taken: float, threads: int) -> int:
    """The host rule's re-check: the CNN's kernel threads now that other processes take ``taken`` cores.

    A CNN on every core (``threads``) runs as fast as its slowest kernel
    thread: with a core taken by another process, one thread of it waits for
    that core at every layer, and every core to it is slower than one thread
    (ResNet50 on this host: 1.84x one thread with the second core free, 0.91x
    with it busy). So it takes the cores left, rounded, at least one, and
    changes only when they differ from its threads by more than
    ``HOST_RECHECK_MARGIN``.

    Args:
      schedule: The host schedule it started on.
      taken: Cores other processes kept busy lately (``edgecap.cpu_load``).
      threads: The CNN's kernel threads now.

    Returns:
      The kernel threads to try from now (``edgecap.rethread`` keeps them
      only if ``keep_threads`` finds them faster).
    """
    if schedule.kind != "threads":
        return threads
    left = schedule.cores - max(0.0, taken)
    if abs(left - threads) <= HOST_RECHECK_MARGIN:
        return threads
    return max(1, min(schedule.cores, int(left + 0.5)))


def other_threads(schedule: HostSchedule, threads: int) -> int:
    """The kernel threads a CNN on ``threads`` tries now and then: one if it runs on more, else every core."""
    return 1 if threads > 1 else schedule.cores


def keep_threads(before_ms: float, after_ms: float) -> bool:
    """Whether a CNN keeps the kernel threads it tried: only if a frame took clearly less time on them.

    A count of the cores others take does not say how much they slow kernel
    threads down: on this host ResNet50 on both cores was 0.91x one thread
    beside one busy process, yet under a load of 6-9 spread over many it was
    faster than one (1.40x at the median, plain loops measured by
    ``edgecap bench --profiles host``). So the rule proposes and the frames decide.

    Args:
      before_ms: The median frame on the threads before the trial.
      after_ms: The median frame of the trial.

    Returns:
      True if the trial's frames took ``HOST_KEEP_MARGIN`` less time: a tie keeps what runs.
    """
    return after_ms < before_ms * (1.0 - HOST_KEEP_MARGIN)


def measure_host(bundle: Bundle, plan: Plan, window: WindowSpec,
                 float_rnn: bool = False) -> Tuple[float, float]:
    """Measures the CNN's one-thread invoke and the RNN steps of a frame on this CPU, in ms.

    One warm-up invoke each, then the fastest of as many as fit in
    ``MEASURE_HOST_S`` (at least two, at most ``MEASURE_HOST_MAX``): the
    fastest is the one no other process interrupted, so a loaded host does
    not make a 0.1 ms CNN look like a 1 ms one, and a start-up stays short.

    Args:
      bundle: The bundle, whose encoder step is timed.
      plan: The CPU plan, whose one segment is timed.
      window: The window shape, which says how many steps a frame takes.
      float_rnn: Time the float step even where the bundle ships an int8 one.

    Returns:
      ``(cnn_ms, rnn_ms)``.
    """
    from edgecap.interpreter import make_cpu_interpreter
    from edgecap.rnn import RnnEncoder, State

    cnn = make_cpu_interpreter(plan.active_stages[0].segment, 1)
    rnn = RnnEncoder(bundle.steps(float_rnn).encoder_step, 1)
    state = State.zeros(bundle.hidden_size)
    feature = np.zeros(bundle.feature_size, np.float32)

    def fastest(call) -> float:
        call()
        times: List[float] = []
        while len(times) < 2 or (len(times) < MEASURE_HOST_MAX and sum(times) < MEASURE_HOST_S):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        return min(times) * 1e3

    cnn_ms = fastest(cnn.invoke)
    step_ms = fastest(lambda: rnn.step(feature, state))
    return cnn_ms, step_ms * windows_per_frame(window.frames, window.stride)


def deadlines(stage: Stage, worker: DeviceSpec, options: CaptionerOptions) -> Tuple[Optional[float], Optional[float]]:
    """The one deadline policy: how long an EdgeTPU invoke may take before its device counts as hung.

    ``deadline_factor`` times the stage's predicted time, never below
    ``deadline_floor_s`` (what a loaded host may add); ``UNPREDICTED_DEADLINE_S``
    (or the floor, if longer) where the plan predicts none. The first invoke
    also loads the stage's on-chip parameters onto the EdgeTPU: it gets the
    deadline plus that load's predicted time with a margin
    (``data/recovery.json``, ``first_invoke``: the on-chip bytes at the
    slowest link, twice over, at least 0.5 s); where the plan predicts no
    time, ``FIRST_INVOKE_GRACE`` times the deadline. A CPU worker is never watched.

    Returns:
      ``(deadline_s, first_deadline_s)``, or ``(None, None)`` for a CPU worker.
    """
    if worker.kind not in TPU_KINDS:
        return None, None
    if stage.predicted_ms is None:
        deadline = max(options.deadline_floor_s, UNPREDICTED_DEADLINE_S)
        return deadline, deadline * FIRST_INVOKE_GRACE
    deadline = max(options.deadline_floor_s, options.deadline_factor * stage.predicted_ms / 1e3)
    return deadline, deadline + load_recovery().first_invoke.load_s(stage.param_bytes.on_chip)


def _settle(bundle: Bundle, options: CaptionerOptions, plan: Plan, *, how: str, reason: str,
            overrides: Optional[Mapping[DeviceSpec, DeviceSpec]] = None, attached: Optional[int] = None,
            board: Optional[str] = None, fallback: Optional[str] = None,
            skipped: Tuple[Tuple[str, str], ...] = ()) -> Choice:
    """Places a plan's stages on workers and decides how each runs."""
    wanted = _wanted(options, plan, overrides)
    emulate = _emulate(options, plan, attached)
    workers = _workers(plan, wanted, emulate)
    emulated = bool(emulate) or any(w.kind == "emu-tpu" for w in workers.values())
    pace_cpu = emulated and all(s.predicted_ms is not None for s in plan.active_stages)
    host = None
    cpu_only = all(w.kind == "cpu" for w in workers.values())
    if cpu_only and not emulated and overrides is None and _host_rule_applies(options):
        host = _host(bundle, plan, options)
        workers = {device: host.cnn_worker for device in workers}
    stages = tuple(_stage_run(c, workers[c.device], plan, options, pace_cpu, host, copy=i) for i, c in _copies(plan))
    rnn_pace, frame_pace = _cpu_paces(plan) if pace_cpu else (0.0, 0.0)
    return Choice(plan=plan, workers=workers, stages=stages, rnn_pace_ms=rnn_pace,
                  rnn_compute=not (options.timing_only and rnn_pace > 0), frame_pace_ms=frame_pace,
                  **_threading(options, host), emulated=emulated, how=how, reason=reason, board=board,
                  fallback=fallback, skipped=skipped, host=host)


def _cpu_paces(plan: Plan) -> Tuple[float, float]:
    """An emulated board CPU's paces: an RNN step, and its own work a frame (as the pricing charges it)."""
    return plan.rnn_ms or 0.0, price(plan).cpu_frame_ms if plan.cpu_frame is not None else 0.0


def _threading(options: CaptionerOptions, host: Optional[HostSchedule]) -> Dict[str, Any]:
    """A choice's ``pipelined``, ``batch`` and ``preprocess_worker``: as the caller set them, else the host rule's."""
    if host is None:
        return dict(pipelined=options.pipelined if options.pipelined is not None else True,
                    batch=options.batch if options.batch is not None else 1,
                    preprocess_worker=PREPROCESS_WORKER)
    # On more than one core a host reads and preprocesses frames on the feeder, beside the
    # models: FFmpeg's own decoding threads would only add their hand-offs.
    beside = host.cores > 1
    return dict(pipelined=host.pipelined, batch=host.batch,
                preprocess_worker=FEEDER if beside else PREPROCESS_WORKER, decode_threads=1 if beside else None)


def _wanted(options: CaptionerOptions, plan: Plan,
            overrides: Optional[Mapping[DeviceSpec, DeviceSpec]]) -> Dict[DeviceSpec, DeviceSpec]:
    """The workers asked for by plan device (``devices_map``, or the caller's overrides), checked against the plan."""
    wanted = dict(options.devices_map if overrides is None else overrides)
    planned = [c.spec for _, c in _copies(plan)]
    unknown = sorted(str(k) for k in wanted if k not in planned)
    if unknown:
        raise ConfigError(
            f"devices_map names {', '.join(unknown)}, which the plan does not use; "
            f"map the plan's devices: {', '.join(str(p) for p in planned)}"
        )
    return wanted


def _emulate(options: CaptionerOptions, plan: Plan, attached: Optional[int]) -> Optional[bool]:
    """Whether the plan's TPU stages run on emulated TPUs: as asked, else when fewer TPUs are attached."""
    tpus = _tpu_specs(plan)
    if options.emulate is not None or not tpus:
        return options.emulate
    if attached is None:
        attached = sum(1 for i in devices.list_devices() if i.kind in ("pci", "usb"))
    return len(tpus) > attached


def _workers(plan: Plan, wanted: Mapping[DeviceSpec, DeviceSpec], emulate: Optional[bool]) -> Dict[str, DeviceSpec]:
    """Each active stage's device, and each copy's (its canonical string) -> the worker that runs it."""
    tpus = _tpu_specs(plan)
    workers: Dict[str, DeviceSpec] = {}
    for i, spec in ((i, c.spec) for i, c in _copies(plan)):
        if spec in wanted:
            workers[str(spec)] = wanted[spec]
        elif spec.kind == "tpu" and emulate:
            # Emulated TPUs are numbered in pipeline order: pci:0 and usb:0 are two TPUs.
            workers[str(spec)] = DeviceSpec("emu-tpu", tpus.index(spec))
        elif spec.kind == "cpu":
            workers[str(spec)] = _cpu_worker(i)
        else:
            workers[str(spec)] = spec
    return workers


def _cpu_worker(copy: int) -> DeviceSpec:
    """The worker of a CNN copy on the CPU: ``cpu`` for the CPU stage; a copy taking whole
    frames runs on a worker of its own (``cpu:1``), beside the RNN steps on ``cpu``."""
    return CPU if copy == 0 else DeviceSpec("cpu", 1)


def _host_rule_applies(options: CaptionerOptions) -> bool:
    """The host rule decides only what the caller left open."""
    return (options.num_threads is None and options.pipelined is None and options.batch is None
            and not options.devices_map)


def _host(bundle: Bundle, plan: Plan, options: CaptionerOptions) -> HostSchedule:
    """The host rule for a plan whose CNN is one CPU stage (a plan of several CPU stages keeps them)."""
    cores = devices.cpu_cores()
    if len(plan.active_stages) != 1:
        return HostSchedule("threads", cores, cores=cores, reason="several CPU stages: every core to each")
    cnn_ms, rnn_ms = measure_host(bundle, plan, options.window(bundle.window), options.float_rnn)
    return host_schedule(cnn_ms, rnn_ms, cores)


def _stage_run(stage: Stage, worker: DeviceSpec, plan: Plan, options: CaptionerOptions, pace_cpu: bool,
               host: Optional[HostSchedule], copy: int = 0) -> StageRun:
    """How one stage (or one copy of it) runs on its worker: threads, pace, isolation and deadlines."""
    on_cpu = stage.spec.kind == "cpu"
    pace_ms: Optional[float] = None
    if worker.kind == "emu-tpu":
        if stage.predicted_ms is None:
            raise ConfigError(f"stage {stage.index} on {worker}: pacing needs the stage's predicted_ms; "
                              "use a plan from `edgecap compile`")
        pace_ms = stage.predicted_ms
    elif on_cpu and pace_cpu:
        # The board's CPU stage time includes the RNN steps (one per window the
        # frame feeds), which the RNN step paces on its own; a copy's does not.
        pace_ms = max(0.0, stage.predicted_ms - (0.0 if copy else plan.rnn_frame_ms))
    recheck = None
    if host is not None:
        threads = host.num_threads
        recheck = host if host.kind == "threads" else None
    else:
        threads = (options.num_threads or devices.cpu_cores()) if on_cpu else 1
    tpu = worker.kind in TPU_KINDS
    isolate = options.isolate
    if isolate is None:
        # Real EdgeTPUs by default (libedgetpu aborts on a USB error); an
        # injected abort or segfault must strike a worker process, not this one.
        isolate = (isolation.SUPPORTED and worker.kind == "tpu") or faults.current().crashes(str(worker))
    deadline, first = deadlines(stage, worker, options)
    bus_name = stage.cost.bus if stage.cost is not None else None
    bus = next((b for b in plan.buses if b.name == bus_name), None)
    return StageRun(stage=stage, worker=worker, threads=threads, recheck=recheck, pace_ms=pace_ms,
                    compute=not (options.timing_only and pace_ms is not None),
                    isolate=bool(isolate) and tpu,  # a CPU stage has no delegate to abort
                    deadline_s=deadline, first_deadline_s=first, bus=bus, copy=copy, share=stage.share)


def _onto(bundle: Bundle, options: CaptionerOptions, plan: Plan, left: Sequence[DeviceSpec], how: str,
          reason: str) -> Choice:
    """Places ``plan`` with its TPU stages, in order, on the TPUs left."""
    tpus = _tpu_specs(plan)
    overrides = {spec: left[i] for i, spec in enumerate(tpus)}
    overrides.update({c.spec: _cpu_worker(i) for i, c in _copies(plan) if c.spec.kind == "cpu"})
    return _settle(bundle, options, plan, how=how, reason=reason, overrides=overrides, attached=len(left))


def _unfit(plan: Plan, hardware: Hardware) -> Optional[str]:
    """Why a bundle plan cannot run on the attached hardware, or None if it can."""
    needed, attached = tpus_used(plan), len(hardware.tpus)
    if needed > attached:
        return f"needs {needed} EdgeTPU(s), {attached} attached"
    # A plan that names a bus (pci:N, usb:N) opens only a TPU on that bus.
    for bus, label in (("pci", "PCIe"), ("usb", "USB")):
        on_bus = len({d for d in _tpu_specs(plan) if d.bus == bus})
        there = sum(1 for t in hardware.tpus if t.kind == bus)
        if on_bus > there:
            return f"needs {on_bus} {label} EdgeTPU(s), {there} attached"
    uncompiled = _uncompiled(plan)
    if uncompiled:
        return f"stage(s) {', '.join(map(str, uncompiled))} not compiled by edgetpu_compiler"
    return None


def _uncompiled(plan: Plan) -> List[int]:
    """The TPU stages edgetpu_compiler did not compile (libedgetpu would run them on the CPU)."""
    return [s.index for s in plan.active_stages if s.spec.kind == "tpu" and s.compiled_segment is None]


def _slug(skipped: Sequence[Tuple[str, str]], attached: int) -> str:
    whys = [why for _, why in skipped]
    if attached == 0:
        return "no-tpu"
    for prefix, slug in (("needs", "fewer-tpus"), ("stage", "uncompiled"), ("made for", "other-window")):
        if any(why.startswith(prefix) for why in whys):
            return slug
    return "bad-plan" if whys else "no-plan-for-board"


def _rank(plan: Plan) -> Tuple[int, float]:
    """The best plan: most TPUs, then the fastest predicted bottleneck."""
    return tpus_used(plan), -(plan.predicted.bottleneck_ms if plan.predicted else float("inf"))


def _tpus(plan: Plan) -> str:
    n = tpus_used(plan)
    return f"{n} EdgeTPU{'s' if n != 1 else ''} + CPU"


def _reference_plan(bundle: Bundle) -> Plan:
    if bundle.reference_encoder is None:
        raise ConfigError(f"{bundle.root}: bundle has no reference_encoder; re-export it with the float encoder")
    try:
        model, _ = open_model(bundle.reference_encoder)
    except (ValueError, RuntimeError, OSError) as exc:
        raise BundleError(f"{bundle.reference_encoder}: not a TFLite model ({exc}); re-export the bundle") from None
    return single_cpu_plan(model)


def _check_fits(plan: Plan, bundle: Bundle) -> None:
    """Raises PlanError unless the plan was compiled from the bundle's encoder."""
    want_in = (1, bundle.input.height, bundle.input.width, bundle.input.channels)
    where = plan.path or "plan"
    if len(plan.inputs) != 1 or plan.inputs[0].shape != want_in:
        raise PlanError(f"{where}: takes {[list(t.shape) for t in plan.inputs]} but the bundle's encoder "
                        f"takes {list(want_in)}; compile the bundle's encoder.tflite")
    if len(plan.outputs) != 1 or int(np.prod(plan.outputs[0].shape)) != bundle.feature_size:
        raise PlanError(f"{where}: outputs {[list(t.shape) for t in plan.outputs]}, not the bundle's "
                        f"{bundle.feature_size} features; compile the bundle's encoder.tflite")
    if plan.model_sha256 != bundle.encoder_model.sha256:
        raise PlanError(f"{where}: compiled from another model than {bundle.encoder} "
                        f"(sha256 differs); re-run `edgecap compile {bundle.root}`")
