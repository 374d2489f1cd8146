"""What runs a plan stage: segment runners on the CPU, a Coral EdgeTPU or an emulated one.

``open_stage`` returns a callable from the tensors named in the plan to the
tensors the stage outputs. Call it in the thread that will run the stage,
which then owns its interpreter. Which devices exist is ``edgecap.devices``.

An emulated EdgeTPU (``emu-tpu:N``) runs its segment on the CPU (outputs
exact) and paces every invoke to the stage's ``predicted_ms``, so a pipeline
behaves as on the board; in timing-only mode it computes nothing and outputs
zeros.
"""

from __future__ import annotations

import ctypes
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import numpy as np

from edgecap import edgetpu_runtime, interpreter
from edgecap.devices import DeviceSpec, parse_device
from edgecap.errors import ConfigError, EdgecapError, PlanError, RunCancelled
from edgecap.modelfile import TensorSpec
from edgecap.plan import Stage
from edgecap.tflite_verify import verify_tflite
from edgecap.scheduler import sleep_until

_PR_SET_TIMERSLACK = 29  # linux/prctl.h

Tensors = Dict[str, np.ndarray]


class Segment:
    """A model segment opened on a device: maps input tensors to output tensors.

    Tensors are matched by name: the segment reads the inputs its model
    declares from the given mapping and returns what its model outputs.

    Attributes:
      isolated: True for a segment in a worker process
        (``edgecap.isolation.IsolatedSegment``), whose ``__call__`` also takes
        ``fault=``.
    """

    isolated = False

    def __call__(self, tensors: Tensors) -> Tensors:
        raise NotImplementedError

    def close(self) -> None:
        """Releases what the segment holds beyond memory (a worker process); idempotent."""


class InterpreterSegment(Segment):
    """A segment run by a TFLite interpreter (the CPU, or an EdgeTPU delegate)."""

    def __init__(self, interp: Any, stage: Stage) -> None:
        """Wraps an allocated interpreter of ``stage``'s segment.

        Args:
          interp: The interpreter.
          stage: The plan stage it runs.

        Raises:
          PlanError: If the segment's inputs are not among the stage's inputs,
            or a stage output is neither computed by it nor forwarded, or a
            tensor's shape or dtype differs from the plan.
        """
        ins, outs = interp.get_input_details(), interp.get_output_details()
        _check_tensors(stage, "input", ins, stage.inputs)
        _check_tensors(stage, "output", outs, stage.outputs)
        computed = {d["name"] for d in outs} | {t.name for t in stage.inputs}
        missing = [t.name for t in stage.outputs if t.name not in computed]
        if missing:
            raise _segment_mismatch(stage, f"does not output {', '.join(missing)}")
        self._io: Optional[interpreter.TensorIO] = interpreter.TensorIO.from_details(interp)
        self._name = f"stage {stage.index}"

    def __call__(self, tensors: Tensors) -> Tensors:
        if self._io is None:
            raise RunCancelled(f"{self._name}: the segment is closed")
        return self._io(tensors)

    def close(self) -> None:
        # The interpreter holds the segment file open: let it go now, not when
        # a cycle that still refers to this segment (a traceback) is collected.
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


def _segment_mismatch(stage: Stage, what: str) -> PlanError:
    return PlanError(
        f"stage {stage.index} ({stage.device}): segment {stage.segment.name} {what}; "
        "the segment files do not match plan.json, re-run `edgecap compile`"
    )


class ZeroSegment(Segment):
    """Timing-only stand-in for a segment: computes nothing, outputs zeros."""

    def __init__(self, outputs: Sequence[TensorSpec]) -> None:
        self._zeros = {t.name: np.zeros(t.shape, dtype=t.dtype) for t in outputs}

    def __call__(self, tensors: Tensors) -> Tensors:
        return dict(self._zeros)


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


class PacedSegment(Segment):
    """Runs a segment and then waits out the rest of its predicted time.

    The deadline is taken from the start of the invoke, so an invoke is never
    faster than ``ms``; when the computation itself is slower, no wait is added.
    Create it in the thread that runs it (see ``Pacer``).
    """

    def __init__(self, segment: Segment, ms: float) -> None:
        self._segment = segment
        self._seconds = ms / 1000.0
        self._pacer = Pacer()

    def __call__(self, tensors: Tensors) -> Tensors:
        deadline = time.perf_counter() + self._seconds
        out = self._segment(tensors)
        self._pacer.wait_until(deadline)
        return out

    def close(self) -> None:
        self._segment.close()


class StageRunner(Segment):
    """Runs one plan stage: its segment, plus the tensors that pass it by.

    Returns exactly the stage's ``outputs``: those the segment computes and
    those it forwards untouched for later stages (docs/plan.md).
    """

    def __init__(self, segment: Segment, outputs: Sequence[TensorSpec]) -> None:
        self._segment = segment
        self._names = [t.name for t in outputs]

    def __call__(self, tensors: Tensors) -> Tensors:
        out = self._segment(tensors)
        return {name: out[name] if name in out else tensors[name] for name in self._names}

    def close(self) -> None:
        self._segment.close()


def open_stage(
    stage: Stage,
    device: "str | DeviceSpec | None" = None,
    *,
    num_threads: int = 1,
    timing_only: bool = False,
    pace: bool = False,
    isolate: bool = False,
    deadline_s: Optional[float] = None,
    first_deadline_s: Optional[float] = None,
) -> Segment:
    """Opens a plan stage on a device; call it in the thread that will run it.

    Args:
      stage: The plan stage (non-empty).
      device: Where to run it (default: the stage's own device). ``emu-tpu:N``
        paces every invoke to the stage's ``predicted_ms``.
      num_threads: CPU threads for the interpreter's kernels (XNNPACK).
      timing_only: Emulated (and paced) stages compute nothing and output zeros.
      pace: Pace the stage to ``predicted_ms`` whatever its device (board emulation).
      isolate: Run the stage in a worker process (``edgecap.isolation``), so that
        a native crash there raises ``DeviceFailed`` here instead of killing this
        process. Pacing then happens in the worker, as part of the invoke.
      deadline_s: With ``isolate``: seconds an invoke may take before the worker
        counts as hung and is killed (default: ``isolation.default_deadline_s``;
        the captioner passes its watchdog's deadline).
      first_deadline_s: With ``isolate``: the first invoke's deadline
        (default: ``deadline_s``).

    Returns:
      The stage as a ``Segment``: the tensors it reads in, its ``outputs`` out;
      with ``isolate``, an ``IsolatedSegment`` (close it when done).

    Raises:
      ConfigError: If pacing is asked for and the stage has no ``predicted_ms``.
      PlanError: If the segment file is corrupt or does not match the stage, or a real
        EdgeTPU is to run a segment edgetpu_compiler did not compile.
      EdgecapError: If no EdgeTPU runtime or device can be opened.
      DeviceFailed: With ``isolate``, if the worker crashes or hangs while opening.
    """
    if device is None:
        spec = stage.spec
    else:
        spec = device if isinstance(device, DeviceSpec) else parse_device(device)
    if isolate:
        from edgecap.isolation import IsolatedSegment  # it imports this module

        return IsolatedSegment(stage, spec, num_threads=num_threads, timing_only=timing_only,
                               pace=pace, deadline_s=deadline_s, first_deadline_s=first_deadline_s)
    paced = pace or spec.kind == "emu-tpu"
    if paced and stage.predicted_ms is None:
        raise ConfigError(
            f"stage {stage.index} on {spec}: pacing needs the stage's predicted_ms; "
            "use a plan from `edgecap compile`"
        )
    opened = stage.compiled_segment if spec.kind == "tpu" else stage.segment
    if opened is not None and not (timing_only and paced):
        # Not every interpreter verifies what it parses (ai-edge-litert 1.4,
        # tflite_runtime, libedgetpu's): a corrupt segment would crash it.
        verify_tflite(opened.read_bytes(), str(opened), error=PlanError,
                      fix="re-run `edgecap compile` to rewrite the plan's segments")
    if timing_only and paced:
        segment: Segment = ZeroSegment(stage.outputs)
    elif spec.kind == "tpu":
        if stage.compiled_segment is None:
            # libedgetpu would run an uncompiled segment's every op on the CPU, silently.
            raise PlanError(
                f"stage {stage.index} on {spec}: {stage.segment.name} was not compiled by "
                "edgetpu_compiler; install it and re-run `edgecap compile`, or run on emu-tpu:N"
            )
        segment = _open_edgetpu(spec, stage)
    else:
        segment = InterpreterSegment(interpreter.make_cpu_interpreter(stage.segment, num_threads), stage)
    runner: Segment = StageRunner(segment, stage.outputs)
    # Pacing wraps the whole stage, forwarding included: that is the device's invoke.
    return PacedSegment(runner, stage.predicted_ms) if paced else runner


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
    edgetpu_runtime.check(str(spec), library, spec.delegate_option, backend, model)
    try:
        return interpreter.load_delegate(library, {"device": spec.delegate_option}, backend)
    except (ValueError, RuntimeError, OSError) as exc:
        raise EdgecapError(
            f"{spec}: cannot open the EdgeTPU ({edgetpu_runtime.one_line(exc)}); "
            "check `edgecap devices`, or run on cpu / emu-tpu:N"
        ) from None


def _open_edgetpu(spec: DeviceSpec, stage: Stage) -> Segment:
    segment = stage.compiled_segment
    backend = interpreter.tpu_backend()
    delegate = load_edgetpu_delegate(spec, segment, backend)
    try:
        interp = interpreter.make_delegate_interpreter(segment, [delegate], backend)
    except (ValueError, RuntimeError) as exc:
        raise EdgecapError(
            f"{spec}: cannot run {Path(segment).name} on the EdgeTPU "
            f"({edgetpu_runtime.one_line(exc)}); "
            "re-run `edgecap compile`, or run on cpu / emu-tpu:N"
        ) from None
    return InterpreterSegment(interp, stage)
