"""Closed-loop planning on the running board: measure each stage, correct the model, switch plans.

A plan's stages record what their predictions are made of (``Stage.cost``:
compute, the fixed invoke cost, bytes over the link, extra CPU work). The
``Adapter`` keeps a running median of every step's measured time per frame
and compares each device's total with what the plan expects of it under the
corrections learned so far. When a device stays off by more than the
policy's threshold for its dwell time (``data/adapt.json``), it refits that
device's ``Correction`` (its speed against the profile and its link rate) on its own thread,
asks the planner for the best plan under the corrections
(``edgecap.planner.choose_measured``) and, when that plan is better by the
margin, posts it; the supervisor switches to it through the path it fails
over by (``Supervisor._switch``), so no window is lost in file mode.

What a plan is expected to take under the corrections is its price
(``edgecap.plans.pricing``), the function the planner re-chooses by.

Corrections are kept per board and plan device (``pci:0``, ``usb:1``, ``cpu``)
in a JSON file (``corrections_path``), and the next start begins on the plan
that is best under them. A corrupt file is one warning line and ignored; a
file of version 1 (a ``compute_scale`` per device, 2.0 for half speed) is
read as the speed it says.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
import statistics
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

import msgspec
import numpy as np

from edgecap import outputs, schema
from edgecap.errors import ConfigError, EdgecapError, PlanError
from edgecap.plans.plan import CostParts, Plan, Stage
from edgecap.plans.pricing import CPU, Correction, Corrections, price
from edgecap.stats import PipelineStats

# A planner.Choice (the planner imports this module, so it is not imported here).
Choice = Any

POLICY = Path(__file__).parent / "data" / "adapt.json"
CORRECTIONS_FILE = "corrections.json"
CORRECTIONS_VERSION = 2
# Version 1 kept each device's compute_scale (2.0: half speed), the inverse of its speed.
_SCALE_VERSION = 1
RNN_STEP = "rnn_step"  # the step whose time the CPU device adds to its CNN stage's

_log = logging.getLogger("edgecap")


class Policy(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """When the running board re-plans (``data/adapt.json``; each value's reason is there).

    Attributes:
      about: What the file is.
      window: Invokes each step's running median covers.
      rel_threshold: A device is off when its median differs from its
        expectation by more than this fraction...
      abs_floor_ms: ... and by more than this many milliseconds.
      dwell_s: Seconds a device must stay off before its correction is refitted.
      check_s: Seconds between two comparisons.
      margin: A plan replaces the running one only if its period is this
        fraction shorter under the corrections.
      cooldown_s: Seconds between two switches.
    """

    about: str
    window: int
    rel_threshold: float
    abs_floor_ms: float
    dwell_s: float
    check_s: float
    margin: float
    cooldown_s: float
    why: Dict[str, str] = {}


@lru_cache(maxsize=None)
def load_policy(path: Path = POLICY) -> Policy:
    """Reads the adaptation policy.

    Raises:
      ConfigError: If the file is missing or malformed.
    """
    return schema.read_file(path, Policy, what="adaptation policy", fix="reinstall edgecap",
                            error=ConfigError)


_NONE = Correction()


def device_stages(plan: Plan, device: str) -> List[Stage]:
    """The stages whose time is a plan device's: its active ones and, on the CPU, an empty CNN
    stage too, which still charges the RNN steps (``cost.extra_ms``) the CPU runs."""
    return [s for s in plan.stages if s.device == device and (not s.empty or device == CPU)]


def adaptable(plan: Plan) -> bool:
    """Whether a plan runs EdgeTPUs and predicts every stage (by its cost parts, or older plans' time alone)."""
    return (any(s.spec.kind == "tpu" for s in plan.active_stages)
            and all(s.cost is not None or s.predicted_ms is not None for s in plan.active_stages))


class RunningMedian:
    """The median of the last ``n`` values added (one writer)."""

    def __init__(self, n: int) -> None:
        self._values: Deque[float] = collections.deque(maxlen=n)

    def add(self, value: float) -> None:
        self._values.append(value)

    @property
    def full(self) -> bool:
        return len(self._values) == self._values.maxlen

    def value(self) -> Optional[float]:
        """The median, or None before the first value."""
        values = tuple(self._values)  # a copy: the deque may grow meanwhile
        return statistics.median(values) if values else None


@dataclass(frozen=True)
class Observation:
    """One device's measured time per frame, and what its plan's stages on it are made of.

    Attributes:
      work_ms: Its own compute and invoke parts, under no correction (for the
        CPU, the RNN steps too).
      link_bytes: Bytes over its link a frame.
      fixed_ms: Work it waits for that another device's correction prices (a
        TPU stage's ops left on the CPU).
      measured_ms: The running median.
    """

    work_ms: float
    link_bytes: int
    fixed_ms: float
    measured_ms: float


def refit(current: Correction, rate: Optional[float], seen: Sequence[Observation]) -> Correction:
    """Refits a device's correction from what it measured, newest observation last.

    With observations of two or more differently made stages (plans switched
    between on this device), the compute scale and the link rate are solved
    for together (least squares). With one, the error is split in proportion
    to what each part contributes to the expectation: both are scaled by the
    same factor. That is the guess with no preference between compute and
    link; the plan it leads to puts other work on the device, whose
    measurement then separates the two.

    Args:
      current: The correction so far.
      rate: The link rate the newest expectation used (None: the device has no link).
      seen: Observations, newest last.

    Returns:
      The new correction.
    """
    last = seen[-1]
    if len(seen) >= 2 and rate is not None:
        # Link time at the rate expected so far: both columns in ms, so the fit is well conditioned.
        a = np.array([[o.work_ms, o.link_bytes * 1e3 / rate] for o in seen])
        y = np.array([o.measured_ms - o.fixed_ms for o in seen])
        if np.linalg.matrix_rank(a) == 2 and np.linalg.cond(a) < 1e3:
            # Each column's factor is how much longer its part takes than expected.
            (slower_work, slower_link), *_ = np.linalg.lstsq(a, y, rcond=None)
            if slower_work > 0 and slower_link > 0:
                return Correction(float(1.0 / slower_work), float(rate / slower_link))
    link_ms = last.link_bytes * 1e3 / rate if rate and last.link_bytes else 0.0
    expected = last.work_ms / current.speed + link_ms
    if expected <= 0:
        return current
    factor = max(0.0, last.measured_ms - last.fixed_ms) / expected
    factor = max(factor, 1e-3)
    new_rate = None if not link_ms else rate / factor
    return Correction(current.speed / factor, new_rate if new_rate else current.link_bytes_per_s)


# ---------------------------------------------------------------------------
# The corrections file.


class _CorrectionDoc(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    # Version 2 writes speed; version 1 wrote compute_scale (1 / speed).
    speed: Optional[schema.Rate] = None
    compute_scale: Optional[schema.Rate] = None
    link_bytes_per_s: Optional[schema.Rate] = None
    predicted_ms: Optional[float] = None
    measured_ms: Optional[float] = None
    updated: Optional[str] = None


class _CorrectionsDoc(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    boards: Dict[str, Dict[str, _CorrectionDoc]] = {}


@dataclass(frozen=True)
class Learned:
    """One device's learned correction as the file keeps it, with its last measurement.

    Attributes:
      board: The board profile.
      device: The plan device (``pci:0``, ``cpu``).
      correction: The correction.
      predicted_ms: What the plan predicted for the device a frame when it was learned.
      measured_ms: What it measured.
      updated: When (ISO 8601, UTC).
    """

    board: str
    device: str
    correction: Correction
    predicted_ms: Optional[float]
    measured_ms: Optional[float]
    updated: Optional[str]


def corrections_path() -> Path:
    """The default corrections file: ``$STATE_DIRECTORY/corrections.json`` under systemd,
    else ``$XDG_CACHE_HOME/edgecap/corrections.json`` (default ``~/.cache``)."""
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if state:
        return Path(state) / CORRECTIONS_FILE
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "edgecap" / CORRECTIONS_FILE


def read_learned(path: Path) -> List[Learned]:
    """Every board's learned corrections in ``path``; a missing file has none.

    A file that cannot be read or is malformed is one warning line and counts as empty.
    """
    if not path.exists():
        return []
    try:
        doc = schema.read_file(path, _CorrectionsDoc, what="corrections",
                               fix="delete it; the board learns them again", error=EdgecapError)
    except EdgecapError as exc:
        _log.warning("edgecap: ignoring learned corrections: %s", exc)
        return []
    if doc.version not in (CORRECTIONS_VERSION, _SCALE_VERSION):
        _log.warning("edgecap: ignoring learned corrections: %s: version %s, this runtime reads %s; "
                     "delete it, the board learns them again", path, doc.version, CORRECTIONS_VERSION)
        return []
    try:
        return [Learned(board, device, _correction(d, doc.version, f"{path}: boards.{board}.{device}"),
                        d.predicted_ms, d.measured_ms, d.updated)
                for board, devices in sorted(doc.boards.items()) for device, d in sorted(devices.items())]
    except EdgecapError as exc:
        _log.warning("edgecap: ignoring learned corrections: %s", exc)
        return []


def _correction(d: _CorrectionDoc, version: int, where: str) -> Correction:
    """A learned correction as its file's version writes it: ``speed``, or version 1's ``compute_scale``."""
    field, value = ("compute_scale", d.compute_scale) if version == _SCALE_VERSION else ("speed", d.speed)
    other = d.speed if version == _SCALE_VERSION else d.compute_scale
    if value is None or other is not None:
        raise EdgecapError(f"{where}: a version {version} file gives each device its {field} alone; "
                           "delete it, the board learns them again")
    return Correction(1.0 / value if version == _SCALE_VERSION else value, d.link_bytes_per_s)


def load_corrections(path: Path, board: str) -> Dict[str, Correction]:
    """One board's learned corrections, by plan device (see ``read_learned``)."""
    return {l.device: l.correction for l in read_learned(path) if l.board == board}


def save_corrections(path: Path, board: str, corrections: Corrections,
                     seen: Mapping[str, Tuple[float, float]]) -> None:
    """Writes one board's corrections into ``path`` (the other boards' stay), atomically.

    Args:
      path: The corrections file.
      board: The board profile.
      corrections: By plan device.
      seen: By plan device: ``(predicted_ms, measured_ms)`` when they were learned.

    Raises:
      ConfigError: If the file cannot be written.
    """
    boards: Dict[str, Dict[str, _CorrectionDoc]] = {}
    for l in read_learned(path):
        c = l.correction
        boards.setdefault(l.board, {})[l.device] = _CorrectionDoc(
            speed=c.speed, link_bytes_per_s=c.link_bytes_per_s, predicted_ms=l.predicted_ms,
            measured_ms=l.measured_ms, updated=l.updated)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    mine = boards.setdefault(board, {})
    for device, c in corrections.items():
        before = mine.get(device)
        predicted, measured = seen.get(device, (None, None))
        if predicted is None and before is not None:  # not measured this time: keep what was
            predicted, measured = before.predicted_ms, before.measured_ms
        mine[device] = _CorrectionDoc(speed=c.speed, link_bytes_per_s=c.link_bytes_per_s,
                                      predicted_ms=None if predicted is None else round(predicted, 4),
                                      measured_ms=None if measured is None else round(measured, 4),
                                      updated=now)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{path.parent}: cannot create it ({exc.strerror}); set STATE_DIRECTORY "
                          "or XDG_CACHE_HOME to a directory you can write") from None
    outputs.write_state(path, schema.encode(_CorrectionsDoc(CORRECTIONS_VERSION, boards)).decode())


# ---------------------------------------------------------------------------
# The loop.


@dataclass(frozen=True)
class Proposal:
    """A switch the adapter proposes.

    Attributes:
      base: The choice it was priced against (stale once another switch ran).
      choice: The choice to switch to.
      devices: The plan devices whose measurements led to it.
      reason: One line: what was measured and what the new plan makes.
    """

    base: Choice
    choice: Choice
    devices: Tuple[str, ...]
    reason: str


class Adapter:
    """Measures a running plan's steps and, when a device stays off its expectation, re-plans.

    ``observe`` runs on the consumer's thread, once a frame; the refit and
    the re-plan run on a thread of the adapter's own (the compiler may take a
    second), which posts a better plan as ``proposal`` for the consumer to
    switch to.

    Args:
      board: The board profile the plans were made for.
      corrections: The corrections learned before (by plan device).
      rechoose: ``(running choice, corrections) -> (choice, reason)`` of the
        best plan if it beats the running one by the margin, else None (the
        planner's ``choose_measured``).
      switching: Whether it may propose switches (False: it only measures).
      store: The corrections file, or None to keep them in memory.
      policy: The policy (default: ``data/adapt.json``).
    """

    def __init__(self, board: str, corrections: Corrections,
                 rechoose: Callable[[Choice, Dict[str, Correction]], Optional[Tuple[Choice, str]]],
                 switching: bool, store: Optional[Path], policy: Optional[Policy] = None) -> None:
        self.policy = policy or load_policy()
        self._board = board
        self.corrections: Dict[str, Correction] = dict(corrections)
        self._rechoose = rechoose
        self._switching = switching
        self._store = store
        self._requests: "queue.Queue[Optional[Dict[str, Any]]]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._pending = False
        self.proposal: Optional[Proposal] = None
        self._seen: Dict[str, Dict[Tuple[float, int], Observation]] = {}
        self._last_switch = -float("inf")
        self._choice: Optional[Choice] = None

    def started(self, choice: Choice, switching: bool = True) -> None:
        """A pipeline of ``choice`` starts: its steps' medians start afresh.

        Args:
          choice: The running choice.
          switching: False while it must not re-plan (a device has failed:
            the failover's plan runs stages where the model does not price them).
        """
        self._choice = choice
        n = self.policy.window
        self._medians: Dict[str, RunningMedian] = {str(r.worker): RunningMedian(n) for r in choice.stages}
        self._medians[RNN_STEP] = RunningMedian(n)
        # Plan device -> the steps whose times are its own: a worker running one
        # plan device, of its kind (a TPU stage moved onto a CPU worker says nothing of the TPU).
        runs: Dict[str, List[Any]] = {}
        for run in choice.stages:
            runs.setdefault(str(run.worker), []).append(run)
        self._devices: Dict[str, List[str]] = {}
        for worker, on in runs.items():
            devices = {r.stage.device for r in on}
            if len(devices) == 1 and all((r.stage.spec.kind == "tpu") == (r.worker.kind in ("tpu", "emu-tpu"))
                                         for r in on):
                device = devices.pop()
                self._devices[device] = [worker, RNN_STEP] if device == "cpu" else [worker]
        if "cpu" not in self._devices and "cpu" not in choice.workers and device_stages(choice.plan, "cpu"):
            self._devices["cpu"] = [RNN_STEP]  # no CNN stage on the CPU: its RNN steps alone
        self._off: Dict[str, float] = {}
        self._last_check = time.perf_counter()
        self._active = switching and self._switching and adaptable(choice.plan)

    def observe(self, board_ms: Mapping[str, float]) -> None:
        """Adds one frame's step times (consumer thread) and compares them every ``check_s``.

        Args:
          board_ms: Milliseconds by worker, and the RNN steps' as ``rnn_step``
            (``FrameResult.board_ms``: an emulated device's paced time).
        """
        medians = self._medians
        for step, ms in board_ms.items():
            m = medians.get(step)
            if m is not None:
                m.add(ms)
        if not self._active or self._pending or self.proposal is not None:
            return
        now = time.perf_counter()
        if now - self._last_check < self.policy.check_s:
            return
        self._last_check = now
        p = self.policy
        for device, steps in self._devices.items():
            measured = self._measured(steps)
            expected = self.expected_ms(device)
            if measured is None or expected is None:
                continue
            if abs(measured - expected) > max(p.rel_threshold * expected, p.abs_floor_ms):
                self._off.setdefault(device, now)
            else:
                self._off.pop(device, None)
        due = [d for d, since in self._off.items() if now - since >= p.dwell_s]
        if due and now - self._last_switch >= p.cooldown_s:
            self._off.clear()
            self._pending = True
            self._submit({"choice": self._choice, "devices": due, "seen": self._observations(due)})

    def expected_ms(self, device: str) -> Optional[float]:
        """What the running plan expects of a plan device a frame, under the corrections."""
        choice = self._choice
        if choice is None:
            return None
        try:
            return price(choice.plan, self.corrections).device_ms(device)
        except PlanError:  # a stage that predicts no time
            return None

    def steps(self, stats: PipelineStats) -> PipelineStats:
        """``stats`` with each step's prediction (the plan's, uncorrected) and running median."""
        choice = self._choice
        if choice is None:
            return stats
        predicted: Dict[str, Optional[float]] = {}
        for run in choice.stages:
            p = run.stage.predicted_ms
            if p is not None and run.stage.device == "cpu":
                p = max(0.0, p - choice.plan.rnn_frame_ms)  # the RNN steps are a step of their own
            predicted[run.name] = p
        predicted[RNN_STEP] = choice.plan.rnn_frame_ms if choice.plan.rnn_ms is not None else None
        stages = []
        for s in stats.stages:
            median = self._medians.get(RNN_STEP if s.name == RNN_STEP else s.worker)
            known = s.name in predicted
            stages.append(dataclasses.replace(
                s, predicted_ms=predicted.get(s.name),
                measured_ms=median.value() if known and median is not None else None))
        return dataclasses.replace(stats, stages=tuple(stages), corrections={
            # compute_scale (1 / speed) is what the service's metric and API have said since version 1.
            d: {"speed": round(c.speed, 4), "compute_scale": round(1.0 / c.speed, 4),
                "link_bytes_per_s": c.link_bytes_per_s}
            for d, c in sorted(self.corrections.items())})

    def take(self) -> Optional[Proposal]:
        """The proposed switch, once (consumer thread)."""
        proposal, self.proposal = self.proposal, None
        if proposal is not None:
            self._last_switch = time.perf_counter()
        return proposal

    def close(self) -> None:
        """Stops the adapter's thread; idempotent."""
        if self._thread is not None:
            self._requests.put(None)
            self._thread.join()
            self._thread = None

    def _measured(self, steps: Sequence[str]) -> Optional[float]:
        total = 0.0
        for step in steps:
            m = self._medians.get(step)
            if m is None or not m.full:
                return None
            total += m.value() or 0.0
        return total

    def _observations(self, devices: Sequence[str]) -> Dict[str, Tuple[Observation, Optional[float]]]:
        """Each device's observation (its stages' parts, as the profile prices them) and link rate."""
        choice = self._choice
        out = {}
        for device in devices:
            measured = self._measured(self._devices[device])
            stages = device_stages(choice.plan, device)
            if measured is None or not stages:
                continue
            # A stage of an older plan says only its time: all of it counts as compute.
            costs = [s.cost or CostParts(compute_ms=s.predicted_ms or 0.0) for s in stages]
            work = sum(c.compute_ms + c.invoke_ms for c in costs)
            fixed = 0.0
            if device == "cpu":
                work += sum(c.extra_ms for c in costs)
            else:
                fixed = sum(c.extra_ms for c in costs) / self.corrections.get(CPU, _NONE).speed
            link_bytes = sum(c.link_bytes for c in costs)
            rate = self.corrections.get(device, _NONE).link_bytes_per_s or next(
                (c.link_bytes_per_s for c in costs if c.link_bytes_per_s), None)
            out[device] = (Observation(work, link_bytes, fixed, measured), rate)
        return out

    def _submit(self, request: Dict[str, Any]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="edgecap-adapt", daemon=True)
            self._thread.start()
        self._requests.put(request)

    def _work(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                return
            try:
                self._replan(request)
            except EdgecapError as exc:  # the compiler refused, the file cannot be written
                _log.warning("edgecap: re-planning from measurements failed: %s", exc)
            finally:
                self._pending = False

    def _replan(self, request: Dict[str, Any]) -> None:
        corrections = dict(self.corrections)
        seen_now: Dict[str, Tuple[float, float]] = {}
        choice: Choice = request["choice"]
        for device, (obs, rate) in request["seen"].items():
            history = self._seen.setdefault(device, {})
            history.pop((round(obs.work_ms, 4), obs.link_bytes), None)
            history[(round(obs.work_ms, 4), obs.link_bytes)] = obs
            while len(history) > 4:
                history.pop(next(iter(history)))
            corrections[device] = refit(corrections.get(device, _NONE), rate, list(history.values()))
            predicted = sum(s.predicted_ms or 0.0 for s in choice.plan.stages if s.device == device)
            seen_now[device] = (predicted, obs.measured_ms)
        self.corrections = corrections
        said = "; ".join(f"{d} measured {m:.2f} ms a frame, predicted {p:.2f}" for d, (p, m) in seen_now.items())
        _log.info("edgecap: %s: corrections now %s", said, _describe(corrections))
        if self._store is not None:
            save_corrections(self._store, self._board, corrections, seen_now)
        found = self._rechoose(choice, corrections)
        if found is not None:
            self.proposal = Proposal(choice, found[0], tuple(seen_now), f"{said}: {found[1]}")


def _describe(corrections: Corrections) -> str:
    parts = []
    for device, c in sorted(corrections.items()):
        rate = f", link {c.link_bytes_per_s / 1e6:.1f} MB/s" if c.link_bytes_per_s else ""
        parts.append(f"{device} at {c.speed:.2f}x speed{rate}")
    return ", ".join(parts) or "none"
