"""How a captioner runs: one frozen record of options, checked once when it is made.

``EdgeCaptioner``, the CLI and the benchmark all build a ``CaptionerOptions``;
nothing downstream re-checks a value it holds.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from edgecap.bundle import WindowSpec
from edgecap.devices import DeviceSpec, parse_device
from edgecap.errors import ConfigError
from edgecap.limits import (DEFAULT_BEAM, MAX_BEAM, MAX_DEADLINE, MAX_QUEUE, MAX_SAMPLE_FPS, MAX_THREADS,
                            MAX_WINDOW_FRAMES)
from edgecap.plans.plan import Plan

PathLike = Union[str, "os.PathLike[str]"]

# The first invoke of a stage the plan predicts no time for may take this many
# times its deadline: a delegate loads the segment's parameters onto the EdgeTPU
# then, and there is no prediction to base that on (edgecap.planner.deadlines).
FIRST_INVOKE_GRACE = 10.0


@dataclass(frozen=True)
class CaptionerOptions:
    """Options of an ``EdgeCaptioner``.

    Attributes:
      plan: A plan.json (or its directory) from ``edgecap compile``, or a loaded
        ``Plan``. None plans on the fly (see ``board``).
      board: With no plan: ``auto`` runs the bundle's compiled plan that fits
        the attached EdgeTPUs, else the whole encoder on the CPU
        (``edgecap.planner``); a board profile name (e.g. ``devboard-usb``)
        plans for that board with the compiler (``edgecap_compile``, imported
        only then) and emulates the TPUs it lacks.
      on_missing_tpu: With ``auto``: ``cpu`` falls back to what can run (one
        warning line); ``fail`` raises when the plan for this board cannot run.
      emulate: Run TPU stages on emulated EdgeTPUs (``emu-tpu:N``) and pace the
        CPU stage to the board's predicted time. None: emulate when the plan
        has more TPU stages than EdgeTPUs are attached.
      devices_map: Plan device -> device to run it on, e.g. ``{"tpu:0": "cpu:1"}``
        (any spelling ``parse_device`` reads; held parsed, as ``DeviceSpec``s);
        overrides ``emulate`` for those devices. Each device needs a worker of
        its own: ``cpu`` is the last stage's and the RNN step's.
      timing_only: Emulated stages compute nothing (zero outputs): for
        scheduler benchmarks; captions are then meaningless.
      pipelined: Run each device on its own thread; False runs every step in
        the calling thread, one frame at a time (the sequential path). None:
        pipelined, or on a CPU-only run what the host rule decides
        (``edgecap.planner.host_schedule``).
      queue_size: Hand-offs each queue between devices holds.
      batch: Frames of a file source handed between devices at once. A
        hand-off costs tens of microseconds of CPU, which matters only when
        stages take well under a millisecond; a camera's newest frame is
        always handed over alone. None: 1 (the host rule never batches).
      frames: Sampled frames per window (default: the bundle's).
      stride: Sampled frames between window starts (default: the bundle's).
      sample_fps: Rate frames are sampled from sources; 0 keeps every frame
        (default: the bundle's).
      num_threads: CPU threads of each CPU encoder stage's interpreter
        (default: the physical cores, or on a CPU-only run the host rule's);
        the RNN step models use one.
      reference_encoder: Use the bundle's float reference encoder instead of
        the int8 one (for measuring quantisation loss); CPU only.
      float_rnn: Run the bundle's float RNN step models even where it ships
        int8-weight ones (``rnn.int8``, docs/bundle.md), as edgecap did before.
      trace: Write a Chrome trace-event JSON of the runs here, atomically, after
        each stream that reaches the end of its frames; a stream that fails, is
        interrupted or is stopped early writes none.
      failover: When an EdgeTPU (real or emulated) fails mid-stream, re-plan
        onto the devices left and go on (docs/runtime.md, Failover); False
        raises ``DeviceFailed`` to the caller instead.
      deadline_factor: An EdgeTPU invoke that takes longer than this many
        times its stage's ``predicted_ms`` (and ``deadline_floor_s``) is hung:
        its device is treated as failed.
      deadline_floor_s: The shortest deadline, in seconds: what a loaded host
        may add to an invoke without it counting as hung. A stage's first
        invoke also gets the predicted time of loading its parameters onto
        the EdgeTPU (``edgecap.planner.deadlines``).
      isolate: Run EdgeTPU stages (real or emulated) in worker processes, so
        that a native crash (libedgetpu's abort) kills the worker, not the
        captioner; CPU stages always run in-process. None isolates real
        ``tpu`` stages, and emulated ones an injected abort or segfault would
        strike. An isolated worker is killed at the invoke's deadline
        (``deadline_factor``, ``deadline_floor_s``), when the watchdog calls
        it hung.
      beam: Width of the decoder's beam search (``edgecap.rnn.RnnDecoder``):
        1 is greedy; each more costs about a decoder step per word of every
        window (docs/runtime.md, Beam search).
      adapt: Measure each stage and, when a device stays off the plan's
        prediction, switch to the plan best for the board as measured
        (``edgecap.adapt``; docs/runtime.md, Closed-loop planning). None: on
        wherever the plan runs EdgeTPUs, real or emulated (an emulated
        device's time is its paced, modelled time); False only measures.
      corrections: The file the learned corrections are kept in and read
        from at start (``edgecap.adapt.corrections_path``). None: the default
        file on real EdgeTPUs; an emulated board keeps them in memory only.

    Raises:
      ConfigError: If a value is out of range (checked when the record is made).
    """

    plan: Union[None, PathLike, Plan] = None
    board: str = "auto"
    on_missing_tpu: str = "cpu"
    emulate: Optional[bool] = None
    devices_map: Mapping[Any, Any] = field(default_factory=dict)
    timing_only: bool = False
    pipelined: Optional[bool] = None
    queue_size: int = 2
    batch: Optional[int] = None
    frames: Optional[int] = None
    stride: Optional[int] = None
    sample_fps: Optional[float] = None
    num_threads: Optional[int] = None
    reference_encoder: bool = False
    float_rnn: bool = False
    trace: Optional[PathLike] = None
    failover: bool = True
    deadline_factor: float = 20.0
    deadline_floor_s: float = 0.5
    isolate: Optional[bool] = None
    beam: int = DEFAULT_BEAM
    adapt: Optional[bool] = None
    corrections: Optional[PathLike] = None

    def __post_init__(self) -> None:
        # Device strings are parsed once, here, at the edge.
        mapping = {_device(k): _device(v) for k, v in dict(self.devices_map).items()}
        object.__setattr__(self, "devices_map", mapping)
        self._check_deadlines()
        self._check_window()
        self._check_workers()
        self._check_choices()
        if self.trace is not None:
            _check_trace(Path(self.trace))

    def _check_deadlines(self) -> None:
        """When an invoke counts as hung."""
        for name in ("deadline_factor", "deadline_floor_s"):
            value = getattr(self, name)
            if not (_is_finite(value) and 0 < value <= MAX_DEADLINE):
                raise ConfigError(f"{name} {value}: use a finite number above 0 and at most "
                                  f"{MAX_DEADLINE:g}")
        if self.deadline_factor < 1:
            raise ConfigError(f"deadline_factor {self.deadline_factor}: an invoke may take its "
                              "predicted time; use 1 or more (default 20)")

    def _check_window(self) -> None:
        """The overrides of the bundle's window."""
        for name in ("frames", "stride"):
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and 0 < value <= MAX_WINDOW_FRAMES):
                raise ConfigError(f"{name} {value}: frames and stride must be whole numbers "
                                  f"from 1 to {MAX_WINDOW_FRAMES}")
        fps = self.sample_fps
        if fps is not None and not (_is_finite(fps) and 0 <= fps <= MAX_SAMPLE_FPS):
            raise ConfigError(f"sample_fps {fps}: make the sample fps a finite number from 0 "
                              f"(every frame) to {MAX_SAMPLE_FPS:g}")

    def _check_workers(self) -> None:
        """Threads, queues and hand-offs."""
        if self.num_threads is not None and not (_is_int(self.num_threads)
                                                 and 1 <= self.num_threads <= MAX_THREADS):
            raise ConfigError(f"{self.num_threads} threads: use 1 to {MAX_THREADS} (leave it out for "
                              "one per physical core)")
        if not (_is_int(self.queue_size) and 1 <= self.queue_size <= MAX_QUEUE):
            raise ConfigError(f"queue_size {self.queue_size}: each queue must hold from 1 to "
                              f"{MAX_QUEUE} frames")
        if self.batch is not None and not (_is_int(self.batch) and 1 <= self.batch <= MAX_QUEUE):
            raise ConfigError(f"batch {self.batch}: hand over at least 1 frame (at most "
                              f"{MAX_QUEUE}) at a time")

    def _check_choices(self) -> None:
        """The beam width and the options that pick one of a few behaviours."""
        if not (_is_int(self.beam) and 1 <= self.beam <= MAX_BEAM):
            raise ConfigError(f"beam {self.beam}: use a whole number from 1 (greedy) to {MAX_BEAM} "
                              f"(default {DEFAULT_BEAM})")
        if self.adapt not in (None, True, False):
            raise ConfigError(f"adapt {self.adapt!r}: use true, false, or leave it out (on wherever "
                              "the plan runs EdgeTPUs)")
        if self.on_missing_tpu not in ("cpu", "fail"):
            raise ConfigError(f"on_missing_tpu {self.on_missing_tpu!r}: use cpu or fail")
        if self.reference_encoder and (self.plan is not None or self.board != "auto"):
            raise ConfigError("reference_encoder runs on the CPU only; drop plan and board")

    def with_overrides(self, **overrides: Any) -> "CaptionerOptions":
        """Returns a copy with the given options replaced (and checked).

        Raises:
          ConfigError: If an option is unknown or out of range.
        """
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(f"unknown captioner option {', '.join(unknown)}; the options are "
                              f"{', '.join(sorted(known))}")
        return dataclasses.replace(self, **overrides)

    def window(self, bundle_window: WindowSpec) -> WindowSpec:
        """Returns the bundle's window with this record's overrides applied."""
        return WindowSpec(
            frames=bundle_window.frames if self.frames is None else self.frames,
            stride=bundle_window.stride if self.stride is None else self.stride,
            sample_fps=bundle_window.sample_fps if self.sample_fps is None else float(self.sample_fps),
        )


def _device(value: Any) -> DeviceSpec:
    return value if isinstance(value, DeviceSpec) else parse_device(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    """Whether ``value`` is a finite int or float (a bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_trace(trace: Path) -> None:
    """Checks the trace can be written: a file in an existing, writable directory."""
    if trace.is_dir() or not trace.parent.is_dir():
        raise ConfigError(f"trace {trace}: not a file in an existing directory; "
                          "choose a writable path")
    if not os.access(trace.parent, os.W_OK):
        raise ConfigError(f"trace {trace}: {trace.parent} is not writable; choose a "
                          "writable path")
