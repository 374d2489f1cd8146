"""What runs a plan stage: segment runners on the CPU, a Coral EdgeTPU or an emulated one.

``open_stage`` returns a ``SegmentRunner``: a callable from the tensors named
in the plan to the tensors the stage outputs. Call it in the thread that will
run the stage, which then owns its interpreter. Which devices exist is ``edgecap.devices``.

An emulated EdgeTPU (``emu-tpu:N``) runs its segment on the CPU (outputs
exact) and paces every invoke to the stage's ``predicted_ms``, so a pipeline
behaves as on the board; in timing-only mode it computes nothing and outputs
zeros. Under a truth (``$EDGECAP_EMULATE``, ``edgecap.emulation``) or behind
a shared bus it paces to what the truth makes of the stage's cost parts.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Sequence

import numpy as np

from edgecap import edgetpu_runtime, emulation, files, interpreter, trial_invoke
from edgecap.devices import DeviceSpec, parse_device
from edgecap.errors import ConfigError, EdgecapError, PlanError, RunCancelled
from edgecap.modelfile import TensorSpec
from edgecap.plans.plan import Bus, Stage
from edgecap.tflite_verify import verify_tflite
from edgecap.scheduler import sleep_until

_PR_SET_TIMERSLACK = 29  # linux/prctl.h

# libedgetpu resolves ":N" afresh at every delegate load, and the first open of a
# USB TPU loads its firmware, which moves it behind the others in libedgetpu's
# list: two stages opening at once could land on one TPU. So TPU stages open one
# at a time, each after every USB TPU is out of its bootloader.
_TPU_OPENING = threading.RLock()
_depth = 0
# Segment SHA-256 -> whether it is EdgeTPU-compiled, for each file content that passed the verifier.
_COMPILED: Dict[str, bool] = {}
_CHECKING = threading.Lock()
_CHECK_LOCKS: Dict[str, threading.Lock] = {}

Tensors = Dict[str, np.ndarray]


class SegmentRunner:
    """Runs one plan stage on one device: its segment, the tensors that pass it by, and its pace.

    One class for every device: a CPU interpreter, an EdgeTPU delegate's, or
    (timing only) none, when it outputs zeros. Returns exactly the stage's
    ``outputs``: those the segment computes and those it forwards untouched
    for later stages (docs/plan.md). With ``pace_ms`` every call takes at
    least that long, forwarding included (that is the device's invoke),
    measured from its start; a slower computation gets no wait added. Create
    it in the thread that runs it (see ``Pacer``); an isolated worker process
    runs the same class (``edgecap.isolation``).

    Attributes:
      isolated: False (an ``IsolatedSegment`` is True, and its call takes ``fault=``).
      paced_ms: A paced stage's last invoke as its pace made it (the emulated
        device's time, *modelled*: what the host added waiting for a core is
        not the board's); None unpaced.
    """

    isolated = False
    paced_ms: Optional[float] = None

    def __init__(self, stage: Stage, io: Optional[interpreter.TensorIO], pace_ms: Optional[float] = None,
                 pace: Optional[emulation.Pace] = None) -> None:
        """Wraps a stage's segment.

        Args:
          stage: The plan stage.
          io: Its allocated interpreter's tensors by name; None outputs zeros (timing only).
          pace_ms: Pace every call to this many milliseconds; None runs unpaced.
          pace: Pace every call to the truth's price of it instead (``emulation.pace``).
        """
        self._io = io
        self._names = [t.name for t in stage.outputs]
        # The segment computes exactly the stage's outputs, forwarding none: its own dict is the result.
        self._direct = io is not None and io.output_names == self._names and pace_ms is None and pace is None
        self._zeros = {t.name: np.zeros(t.shape, dtype=t.dtype) for t in stage.outputs} if io is None else {}
        self._pace_s = None if pace_ms is None else pace_ms / 1000.0
        self._pace = pace
        self._pacer = None if pace_ms is None and pace is None else Pacer()
        self._closed = False
        self._label = f"stage {stage.index}"

    def __call__(self, tensors: Tensors) -> Tensors:
        if self._closed:
            raise RunCancelled(f"{self._label}: the segment is closed")
        if self._direct:
            return self._io(tensors)
        start = time.perf_counter()
        out = self._zeros if self._io is None else self._io(tensors)
        result = {name: out[name] if name in out else tensors[name] for name in self._names}
        if self._pace is not None:
            deadline = self._pace.deadline(start)
        elif self._pacer is not None:
            deadline = start + self._pace_s
        else:
            return result
        self._pacer.wait_until(deadline)
        self.paced_ms = (deadline - start) * 1e3
        return result

    def close(self) -> None:
        """Lets the interpreter go (it holds the segment file open); idempotent."""
        # Now, not when a cycle that still refers to this runner (a traceback) is collected.
        self._closed = True
        self._io = None


def _check_tensors(stage: Stage, kind: str, details: Sequence[Dict[str, Any]],
                   specs: Sequence[TensorSpec]) -> None:
    by_name = {t.name: t for t in specs}
    for d in details:
        spec = by_name.get(d["name"])
        has = (tuple(int(x) for x in d["shape"]), np.dtype(d["dtype"]).name)
        if spec is None and kind == "input":
            raise _segment_mismatch(stage, f"reads {d['name']}, which the plan's inputs do not list")
        if spec is not None and has != (spec.shape, spec.dtype):
            raise _segment_mismatch(
                stage, f"{kind} {d['name']} is {has[1]}{list(has[0])}, the plan says "
                f"{spec.dtype}{list(spec.shape)}"
            )


def _bind(interp: Any, stage: Stage) -> interpreter.TensorIO:
    """Checks an allocated interpreter of ``stage``'s segment against the plan and binds its tensors.

    Raises:
      PlanError: If the segment's inputs are not among the stage's inputs, or
        a stage output is neither computed by it nor forwarded, or a tensor's
        shape or dtype differs from the plan.
    """
    ins, outs = interp.get_input_details(), interp.get_output_details()
    _check_tensors(stage, "input", ins, stage.inputs)
    _check_tensors(stage, "output", outs, stage.outputs)
    computed = {d["name"] for d in outs} | {t.name for t in stage.inputs}
    missing = [t.name for t in stage.outputs if t.name not in computed]
    if missing:
        raise _segment_mismatch(stage, f"does not output {', '.join(missing)}")
    return interpreter.TensorIO.from_details(interp)


def _segment_mismatch(stage: Stage, what: str) -> PlanError:
    return PlanError(
        f"stage {stage.index} ({stage.device}): segment {stage.segment.name} {what}; "
        "the segment files do not match plan.json, re-run `edgecap compile`"
    )


class Pacer:
    """Sleeps until deadlines, waking within microseconds of them.

    Create it in the thread that paces: on Linux it sets that thread's timer
    slack to 1 ns (``PR_SET_TIMERSLACK``; the default 50 us would make every
    paced invoke late by that much).
    """

    def __init__(self) -> None:
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)

    @staticmethod
    def wait_until(deadline: float) -> None:
        """Sleeps until ``time.perf_counter()`` reaches ``deadline``; returns at once if it has.

        On a pipeline thread it wakes early when the run is stopped
        (``scheduler.sleep_until``), so a paced stage never delays a stop.
        """
        sleep_until(deadline)


def open_stage(
    stage: Stage,
    device: "str | DeviceSpec | None" = None,
    *,
    num_threads: int = 1,
    timing_only: bool = False,
    pace_ms: Optional[float] = None,
    bus: Optional[Bus] = None,
) -> SegmentRunner:
    """Opens a plan stage on a device, in-process; call it in the thread that will run it.

    (A stage in a worker process is ``edgecap.isolation.IsolatedSegment``,
    which opens it with this function there.)

    Args:
      stage: The plan stage (non-empty).
      device: Where to run it (default: the stage's own device).
      num_threads: CPU threads for the interpreter's kernels (XNNPACK).
      timing_only: A paced stage computes nothing and outputs zeros.
      pace_ms: Pace every invoke to this many ms. On ``emu-tpu:N`` the
        default is the stage's ``predicted_ms``: an emulated EdgeTPU is its
        segment run on the CPU at the board's predicted pace. A paced
        ``emu-tpu:N`` or ``cpu`` stage follows ``$EDGECAP_EMULATE``'s truth
        (``edgecap.emulation``) where it names the device.
      bus: The plan bus (``Plan.buses``) the stage's ``cost.bus`` names: an
        emulated stage's link bytes take time on its shared clock.

    Returns:
      The ``SegmentRunner``: the tensors it reads in, its ``outputs`` out.

    Raises:
      ConfigError: If an emulated device is to run a stage with no ``predicted_ms``,
        or ``$EDGECAP_EMULATE`` is malformed.
      PlanError: If the segment file is corrupt or does not match the stage, or a real
        EdgeTPU is to run a segment edgetpu_compiler did not compile.
      EdgecapError: If no EdgeTPU runtime or device can be opened.
    """
    if device is None:
        spec = stage.spec
    else:
        spec = device if isinstance(device, DeviceSpec) else parse_device(device)
    if spec.kind == "emu-tpu" and pace_ms is None:
        if stage.predicted_ms is None:
            raise ConfigError(
                f"stage {stage.index} on {spec}: pacing needs the stage's predicted_ms; "
                "use a plan from `edgecap compile`"
            )
        pace_ms = stage.predicted_ms
    paced = pace_ms is not None
    truth_pace = emulation.pace(stage, spec, pace_ms, bus) if paced else None
    opened = stage.compiled_segment if spec.kind == "tpu" else stage.segment
    if opened is not None and not (timing_only and paced):
        _check_segment(stage, spec, opened)
    if timing_only and paced:
        return SegmentRunner(stage, None, pace_ms, truth_pace)
    if spec.kind == "tpu":
        if stage.compiled_segment is None:
            # libedgetpu would run an uncompiled segment's every op on the CPU, silently.
            raise PlanError(
                f"stage {stage.index} on {spec}: {stage.segment.name} was not compiled by "
                "edgetpu_compiler; install it and re-run `edgecap compile`, or run on emu-tpu:N"
            )
        return SegmentRunner(stage, _open_edgetpu(spec, stage), pace_ms)
    return SegmentRunner(stage, _bind(interpreter.make_cpu_interpreter(stage.segment, num_threads), stage), pace_ms,
                         truth_pace)


def _check_segment(stage: Stage, spec: DeviceSpec, opened: Path) -> None:
    """Verifies a segment file, and on a CPU runs its first invoke in a child, once per content.

    Not every interpreter verifies what it parses (ai-edge-litert 1.4,
    tflite_runtime, libedgetpu's): a corrupt segment would crash it. A
    replicated stage's copies open the same file, each in its own thread at
    once: one verifies it, the others wait and take its answer.
    """
    fix = "re-run `edgecap compile` to rewrite the plan's segments"
    data = files.read_bytes(opened, what="segment", fix=fix, kind="model", error=PlanError)
    digest = hashlib.sha256(data).hexdigest()
    with _CHECKING:
        lock = _CHECK_LOCKS.setdefault(digest, threading.Lock())
    with lock:
        if digest not in _COMPILED:
            _COMPILED[digest] = verify_tflite(data, str(opened), error=PlanError, fix=fix).edgetpu_compiled
        if _COMPILED[digest] and spec.kind != "tpu":
            raise PlanError(
                f"stage {stage.index} on {spec}: {opened.name} is EdgeTPU-compiled (its edgetpu-custom-op "
                "cannot run on a CPU): an emulated run of it is timing-only (paced to predicted_ms, "
                "outputs zeros); run timing-only, or on a real EdgeTPU")
        if spec.kind != "tpu":  # a segment the verifier passes may still crash a kernel: a child runs it first
            trial_invoke.check(data, opened, error=PlanError, fix=fix)


@contextlib.contextmanager
def tpu_opening() -> Iterator[None]:
    """Holds this process's one EdgeTPU opening (re-entrant); the outermost brings every
    USB TPU out of its bootloader first (``edgetpu_runtime.enumerate_tpus(wake=True)``).

    ``edgecap.isolation`` holds it while a worker process opens a TPU stage, so
    that stages in other processes open one at a time too.
    """
    global _depth
    with _TPU_OPENING:
        if _depth == 0:
            edgetpu_runtime.enumerate_tpus(wake=True)
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1


def load_edgetpu_delegate(spec: DeviceSpec, model: "str | Path | None" = None,
                          backend: Optional[str] = None) -> Any:
    """Loads libedgetpu's delegate for one EdgeTPU, after probing it in a child process.

    The first load of a library file for a device runs ``edgecap.edgetpu_runtime``'s
    probe (load the delegate, invoke ``model``) in a child, so that a libedgetpu
    that crashes this TFLite build kills the child, not this process. The
    library is ``$EDGECAP_EDGETPU_LIBRARY``, else the platform's libedgetpu.

    Args:
      spec: A parsed ``tpu`` device (see ``parse_device``).
      model: The model the probe invokes (default: a tiny CPU model).
      backend: The interpreter backend (default: ``interpreter.tpu_backend()``).

    Returns:
      The delegate, for ``interpreter.make_delegate_interpreter`` with the same backend.

    Raises:
      EdgecapError: One line, if the Edge TPU runtime is not installed, crashes
        under this TFLite build, or the device cannot be opened.
    """
    library = edgetpu_runtime.library_name()
    backend = backend or interpreter.tpu_backend() or interpreter.BACKEND or "ai-edge-litert"
    with tpu_opening():
        edgetpu_runtime.check(str(spec), library, spec.delegate_option, backend, model)
        try:
            return interpreter.load_delegate(library, {"device": spec.delegate_option}, backend)
        except (ValueError, RuntimeError, OSError) as exc:
            raise EdgecapError(
                f"{spec}: cannot open the EdgeTPU ({edgetpu_runtime.one_line(exc)}); "
                "check `edgecap devices`, or run on cpu / emu-tpu:N"
            ) from None


def _open_edgetpu(spec: DeviceSpec, stage: Stage) -> interpreter.TensorIO:
    segment = stage.compiled_segment
    backend = interpreter.tpu_backend()
    try:
        with tpu_opening():  # the interpreter's creation opens the device too
            delegate = load_edgetpu_delegate(spec, segment, backend)
            interp = interpreter.make_delegate_interpreter(segment, [delegate], backend)
    except (ValueError, RuntimeError) as exc:
        raise EdgecapError(
            f"{spec}: cannot run {Path(segment).name} on the EdgeTPU "
            f"({edgetpu_runtime.one_line(exc)}); "
            "re-run `edgecap compile`, or run on cpu / emu-tpu:N"
        ) from None
    return _bind(interp, stage)
