"""The captioning API: ``EdgeCaptioner`` turns a video source into ``Caption`` records.

Every sampled frame goes through the plan's CNN stages (each on its device's
worker thread), then the RNN encoder step of every window the frame belongs
to (on the CPU worker), then, when a window is complete, the greedy decoder
(on a worker of its own, so decoding never stalls the CNN). The scheduler
(``edgecap.scheduler``) runs these steps pipelined across frames.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import numpy as np

from edgecap import devices
from edgecap.bundle import Bundle, WindowSpec, load_bundle
from edgecap.errors import ConfigError, EdgecapError, PlanError
from edgecap.plan import Plan, Stage, file_sha256, load_plan, single_cpu_plan
from edgecap.preprocess import Preprocessor, dequantize
from edgecap.rnn import RnnDecoder, RnnEncoder, State
from edgecap.scheduler import Pipeline, Step
from edgecap.sources import Frame, FrameSource, SourceLike, open_source, sample
from edgecap.stats import PipelineStats
from edgecap.trace import Tracer

STAGES = ("preprocess", "cnn", "rnn_step", "decode")
CPU_WORKER = "cpu"
DECODE_WORKER = "decode"


@dataclass
class Caption:
    """The sentence for one window of sampled frames.

    Attributes:
      text: The caption.
      tokens: Its token ids (without bos/eos).
      window: Window number in the stream (0-based).
      start_frame: Source index of the window's first sampled frame.
      end_frame: Source index of its last sampled frame.
      start_time: Source timestamp (s) of the first frame.
      end_time: Source timestamp (s) of the last frame.
      stage_ms: Milliseconds each stage spent on this window's frames.
      latency_ms: From the window's last frame leaving the source to this caption.
    """

    text: str
    tokens: List[int]
    window: int
    start_frame: int
    end_frame: int
    start_time: float
    end_time: float
    stage_ms: Dict[str, float] = field(default_factory=dict)
    latency_ms: float = 0.0

    def to_dict(self) -> Dict[str, Any]:
        """Returns the record as JSON-ready plain types."""
        return dataclasses.asdict(self)


@dataclass
class _FrameJob:
    """One sampled frame on its way through the pipeline."""

    stream: object
    frame: Frame
    tensors: Dict[str, np.ndarray]
    arrived: float
    ms: Dict[str, float]
    finished: List[Tuple["_Window", Frame]] = field(default_factory=list)
    captions: List[Caption] = field(default_factory=list)


@dataclass
class _Window:
    number: int
    state: State
    first: Frame
    stage_ms: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))


def _windows_of(k: int, spec: WindowSpec) -> range:
    """Window numbers whose span of sampled frames contains sample ``k``."""
    first = max(0, -(-(k - spec.frames + 1) // spec.stride))
    return range(first, k // spec.stride + 1)


class _CnnStage:
    """One plan stage of the CNN on its device; owned by that device's worker."""

    def __init__(self, stage: Stage, device: str, **options: Any) -> None:
        self._runner = devices.open_stage(stage, device, **options)

    def __call__(self, job: _FrameJob) -> _FrameJob:
        t0 = time.perf_counter()
        job.tensors = self._runner(job.tensors)
        job.ms["cnn"] += (time.perf_counter() - t0) * 1e3
        return job


class _RnnStep:
    """The RNN encoder step of every window a frame belongs to; owned by the CPU worker.

    Holds the step model and the state of each open window. Frames are counted
    as they arrive, so frames a live source dropped never hold a window open;
    a new stream starts from no open window.
    """

    def __init__(self, bundle: Bundle, spec: WindowSpec, pace_ms: float, feature: str,
                 feature_detail: Dict[str, Any]) -> None:
        self._rnn = RnnEncoder(bundle.encoder_step, 1)
        self._hidden = bundle.hidden_size
        self._spec = spec
        self._feature, self._feature_detail = feature, feature_detail
        self._pace_s = pace_ms / 1000.0
        self._pacer = devices.Pacer() if pace_ms else None
        self._stream: object = None
        self._k = 0
        self._open: Dict[int, _Window] = {}

    def __call__(self, job: _FrameJob) -> _FrameJob:
        t0 = time.perf_counter()
        if job.stream is not self._stream:
            self._stream, self._k, self._open = job.stream, 0, {}
        k, self._k = self._k, self._k + 1
        feature = dequantize(job.tensors.pop(self._feature), self._feature_detail)
        for n in _windows_of(k, self._spec):
            win = self._open.get(n)
            if win is None:
                win = self._open[n] = _Window(n, State.zeros(self._hidden), first=job.frame)
            ts = time.perf_counter()
            win.state = self._rnn.step(feature, win.state)
            if self._pacer is not None:
                self._pacer.wait_until(ts + self._pace_s)
            win.stage_ms["rnn_step"] += (time.perf_counter() - ts) * 1e3
            win.stage_ms["preprocess"] += job.ms["preprocess"]
            win.stage_ms["cnn"] += job.ms["cnn"]
            if k == n * self._spec.stride + self._spec.frames - 1:
                job.finished.append((self._open.pop(n), job.frame))
        job.ms["rnn_step"] = (time.perf_counter() - t0) * 1e3
        return job


class _Decode:
    """The greedy decoder of finished windows; owned by the decode worker."""

    def __init__(self, bundle: Bundle) -> None:
        self._decoder = RnnDecoder(bundle.decoder_step, 1)
        self._bundle = bundle

    def __call__(self, job: _FrameJob) -> _FrameJob:
        tok = self._bundle.tokens
        for win, last in job.finished:
            t = time.perf_counter()
            ids = self._decoder.decode(win.state, tok.bos, tok.eos, self._bundle.max_caption_length)
            done = time.perf_counter()
            win.stage_ms["decode"] = (done - t) * 1e3
            job.captions.append(
                Caption(
                    text=self._bundle.detokenize(ids),
                    tokens=ids,
                    window=win.number,
                    start_frame=win.first.index,
                    end_frame=last.index,
                    start_time=win.first.timestamp,
                    end_time=last.timestamp,
                    stage_ms={k: round(v, 3) for k, v in win.stage_ms.items()},
                    latency_ms=round((done - job.arrived) * 1e3, 3),
                )
            )
        job.finished = []
        return job


class EdgeCaptioner:
    """Captions video with a model bundle, pipelined over the plan's devices.

    Use it as a context manager, or call ``close()``::

        with EdgeCaptioner("models/demo/bundle") as cap:
            for caption in cap.stream("clip.mp4"):
                print(caption.start_time, caption.text)
    """

    def __init__(
        self,
        bundle: Union[str, "os.PathLike[str]", Bundle],
        *,
        plan: Union[None, str, "os.PathLike[str]", Plan] = None,
        board: str = "auto",
        emulate: Optional[bool] = None,
        devices_map: Optional[Mapping[str, str]] = None,
        timing_only: bool = False,
        pipelined: bool = True,
        queue_size: int = 2,
        batch: int = 1,
        frames: Optional[int] = None,
        stride: Optional[int] = None,
        sample_fps: Optional[float] = None,
        num_threads: Optional[int] = None,
        reference_encoder: bool = False,
        trace: Union[None, str, "os.PathLike[str]"] = None,
    ):
        """Loads the bundle and the plan, and starts a worker thread per device.

        Args:
          bundle: A bundle directory or a loaded ``Bundle``.
          plan: A plan.json (or its directory) from ``edgecap compile``, or a
            loaded ``Plan``. None plans on the fly (see ``board``).
          board: With no plan: ``auto`` runs the whole encoder on the CPU; a
            board profile name (e.g. ``devboard-usb``) plans for that board with
            the compiler (``edgecap_compile``, imported only then).
          emulate: Run TPU stages on emulated EdgeTPUs (``emu-tpu:N``) and pace
            the CPU stage to the board's predicted time. None: emulate when the
            plan has TPU stages and no EdgeTPU is attached.
          devices_map: Plan device -> device to run it on, e.g.
            ``{"tpu:0": "cpu:1"}`` (any spelling ``parse_device`` reads);
            overrides ``emulate`` for those devices. Each device needs a
            worker of its own: ``cpu`` is the last stage's and the RNN step's.
          timing_only: Emulated stages compute nothing (zero outputs): for
            scheduler benchmarks; captions are then meaningless.
          pipelined: Run each device on its own thread; False runs every step
            in the calling thread, one frame at a time (the sequential path).
          queue_size: Hand-offs each queue between devices holds.
          batch: Frames of a file source handed between devices at once. A
            hand-off costs tens of microseconds of CPU, which matters only when
            stages take well under a millisecond (a small CNN on a fast CPU);
            a camera's newest frame is always handed over alone.
          frames: Sampled frames per window (default: the bundle's).
          stride: Sampled frames between window starts (default: the bundle's).
          sample_fps: Rate frames are sampled from sources; 0 keeps every frame
            (default: the bundle's).
          num_threads: CPU threads of each CPU encoder stage's interpreter
            (default: the physical cores); the RNN step models use one.
          reference_encoder: Use the bundle's float reference encoder instead of
            the int8 one (for measuring quantisation loss); CPU only.
          trace: Write a Chrome trace-event JSON of the runs here (on ``close()``
            and after each stream).

        Raises:
          BundleError: If the bundle fails validation.
          PlanError: If the plan fails validation or does not fit the bundle.
          ConfigError: If an option is out of range.
          EdgecapError: If a device cannot be opened.
        """
        if trace is not None and (Path(trace).is_dir() or not Path(trace).parent.is_dir()):
            raise ConfigError(f"trace {trace}: not a file in an existing directory; choose a writable path")
        self.bundle = bundle if isinstance(bundle, Bundle) else load_bundle(bundle)
        w = self.bundle.window
        self.window = WindowSpec(
            frames=w.frames if frames is None else frames,
            stride=w.stride if stride is None else stride,
            sample_fps=w.sample_fps if sample_fps is None else sample_fps,
        )
        if self.window.frames <= 0 or self.window.stride <= 0 or not 0 <= self.window.sample_fps < math.inf:
            w = self.window
            raise ConfigError(f"window of {w.frames} frames, stride {w.stride}, sample fps "
                              f"{w.sample_fps}: frames and stride must be > 0 and the sample "
                              "fps a finite number >= 0")
        if num_threads is not None and num_threads < 1:
            raise ConfigError(f"{num_threads} threads: use 1 or more (leave it out for one per "
                              "physical core)")
        if queue_size < 1:
            raise ConfigError(f"queue_size {queue_size}: each queue must hold at least 1 frame")
        if batch < 1:
            raise ConfigError(f"batch {batch}: hand over at least 1 frame at a time")
        if reference_encoder:
            if self.bundle.reference_encoder is None:
                raise ConfigError(f"{self.bundle.root}: bundle has no reference_encoder; "
                                  "re-export it with the float encoder")
            if plan is not None or board != "auto":
                raise ConfigError("reference_encoder runs on the CPU only; drop plan and board")
            self.plan = single_cpu_plan(self.bundle.reference_encoder)
        else:
            self.plan = _resolve_plan(self.bundle, plan, board)
        self._threads = num_threads or devices.cpu_cores()
        self._timing_only = timing_only
        self.devices = _placement(self.plan, emulate, devices_map or {})
        if emulate is None:
            emulate = any(devices.parse_device(d).kind == "emu-tpu" for d in self.devices.values())
        # Emulating a board paces its CPU stage too, when the plan predicts it.
        self._pace_cpu = emulate and all(s.predicted_ms is not None for s in self.plan.active_stages)
        self._rnn_ms = self.plan.rnn_ms or 0.0
        model_in, model_out = self.plan.inputs[0], self.plan.outputs[0]
        self._input_name, self._output_name = model_in.name, model_out.name
        self._output_detail = {"quantization": (model_out.scale, model_out.zero_point)}
        self._preprocess = Preprocessor(
            self.bundle.input,
            {"dtype": np.dtype(model_in.dtype), "quantization": (model_in.scale, model_in.zero_point)},
        )
        self._tracer = Tracer() if trace is not None else None
        self._trace_path = trace
        self._source: Optional[FrameSource] = None
        self._closed = False
        self._pipeline = Pipeline(
            self._steps(), pipelined=pipelined, queue_size=queue_size, batch=batch,
            tracer=self._tracer
        )

    def _steps(self) -> List[Step]:
        steps = [self._cnn_step(s) for s in self.plan.active_stages]
        rnn = functools.partial(_RnnStep, self.bundle, self.window, self._rnn_ms if self._pace_cpu else 0.0,
                                self._output_name, self._output_detail)
        steps.append(Step("rnn_step", CPU_WORKER, rnn))
        steps.append(Step("decode", DECODE_WORKER, functools.partial(_Decode, self.bundle)))
        return steps

    def _cnn_step(self, stage: Stage) -> Step:
        device = self.devices[stage.device]
        on_cpu = devices.parse_device(stage.device).kind == "cpu"
        if on_cpu and self._pace_cpu:
            # The board's CPU stage time includes the RNN step, which is paced on its own.
            stage = dataclasses.replace(stage, predicted_ms=max(0.0, stage.predicted_ms - self._rnn_ms))
        opener = functools.partial(
            _CnnStage, stage, device, num_threads=self._threads if on_cpu else 1,
            timing_only=self._timing_only, pace=on_cpu and self._pace_cpu,
        )
        return Step(f"stage{stage.index}", device, opener)

    def caption_frames(self, frames: Any) -> List[Caption]:
        """Captions frames that are already sampled, one caption per complete window.

        Args:
          frames: HxWx3 uint8 BGR images, a ``[T,H,W,3]`` array or any iterable.

        Returns:
          The captions of every complete window, in order.
        """
        return list(self.stream(frames, fps=0))

    def stream(self, source: SourceLike, fps: Optional[float] = None) -> Iterator[Caption]:
        """Yields a ``Caption`` as each window of sampled frames completes.

        A trailing window with fewer than ``frames`` frames is not captioned.
        Frames of a live source (a camera) that arrive while the pipeline is
        busy are dropped, the newest kept; a file is read at the pipeline's pace.
        Stopping the iteration early stops the run and closes the source.

        Args:
          source: A video file path, a camera (``/dev/video0`` or an index) or
            an iterable of HxWx3 uint8 BGR frames.
          fps: Rate of in-memory frames; 0 or None treats each one as a sampled
            frame. Files and cameras carry their own timing.

        Raises:
          SourceError: If the source cannot be opened or read.
          EdgecapError: If the captioner is closed.
        """
        if self._closed:
            raise EdgecapError("this EdgeCaptioner is closed; create a new one to caption more video")
        in_memory_rate = fps or self.window.sample_fps or 30.0
        src = open_source(source, fps=in_memory_rate)
        try:
            run = self._pipeline.run(self._jobs(src), live=src.live)
            self._source = src  # not before: a stream refused as busy must not replace the running one's
            try:
                for job in run:
                    yield from job.captions
            finally:
                run.close()
        finally:
            src.close()
            self._write_trace()

    def _jobs(self, src: FrameSource) -> Iterator[_FrameJob]:
        # Runs on the pipeline's feeder thread: read, sample, preprocess.
        stream = object()
        for frame in sample(src, self.window.sample_fps):
            t0 = time.perf_counter()
            x = self._preprocess(frame.image)
            ms = dict.fromkeys(STAGES, 0.0)
            ms["preprocess"] = (time.perf_counter() - t0) * 1e3
            yield _FrameJob(stream, frame, {self._input_name: x}, t0, ms)

    def stats(self) -> Optional[PipelineStats]:
        """Statistics of the current or latest stream (None before the first).

        ``dropped`` counts frames a live source or the pipeline discarded.
        """
        stats = self._pipeline.stats()
        if stats is None or self._source is None:
            return stats
        return dataclasses.replace(stats, dropped=stats.dropped + self._source.dropped)

    def close(self) -> None:
        """Stops the run in progress and joins every worker thread; idempotent."""
        self._closed = True
        self._pipeline.close()
        self._write_trace()

    def _write_trace(self) -> None:
        if self._tracer is not None:
            self._tracer.write(self._trace_path)

    def __enter__(self) -> "EdgeCaptioner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _resolve_plan(bundle: Bundle, plan: Union[None, str, "os.PathLike[str]", Plan], board: str) -> Plan:
    if isinstance(plan, Plan):
        resolved = plan
    elif plan is not None:
        resolved = load_plan(plan)
    elif board == "auto":
        # Built from the bundle's own encoder: it fits by construction, and
        # checking would only hash the encoder a second time.
        return single_cpu_plan(bundle.encoder)
    else:
        from edgecap.planning import plan_for_board  # imports the compiler lazily

        resolved = plan_for_board(bundle, board)
    _check_plan_fits(resolved, bundle)
    return resolved


def _check_plan_fits(plan: Plan, bundle: Bundle) -> None:
    want_in = (1, bundle.input.height, bundle.input.width, bundle.input.channels)
    if len(plan.inputs) != 1 or plan.inputs[0].shape != want_in:
        raise PlanError(
            f"{plan.path or 'plan'}: takes {[list(t.shape) for t in plan.inputs]} but the bundle's encoder "
            f"takes {list(want_in)}; compile the bundle's encoder.tflite"
        )
    if len(plan.outputs) != 1 or int(np.prod(plan.outputs[0].shape)) != bundle.feature_size:
        raise PlanError(
            f"{plan.path or 'plan'}: outputs {[list(t.shape) for t in plan.outputs]}, not the bundle's "
            f"{bundle.feature_size} features; compile the bundle's encoder.tflite"
        )
    if plan.model_sha256 != file_sha256(bundle.encoder):
        raise PlanError(
            f"{plan.path or 'plan'}: compiled from another model than {bundle.encoder} "
            f"(sha256 differs); re-run `edgecap compile {bundle.root}`"
        )


def _placement(plan: Plan, emulate: Optional[bool], overrides: Mapping[str, str]) -> Dict[str, str]:
    """Plan device -> worker device: TPU stages on EdgeTPUs, emulated ones, or as overridden."""
    # Both sides normalised, so "TPU:0", ":0" and "tpu:0" name the same device.
    wanted = {str(devices.parse_device(k)): str(devices.parse_device(v)) for k, v in overrides.items()}
    planned = {str(devices.parse_device(s.device)): s.device for s in plan.active_stages}
    unknown = sorted(set(wanted) - set(planned))
    if unknown:
        raise ConfigError(
            f"devices_map names {', '.join(unknown)}, which the plan does not use; "
            f"map the plan's devices: {', '.join(planned)}"
        )
    tpus = [s.device for s in plan.active_stages if devices.parse_device(s.device).kind == "tpu"]
    if emulate is None:
        attached = sum(1 for i in devices.list_devices() if i.kind in ("pci", "usb")) if tpus else 0
        emulate = len(tpus) > attached
    placement: Dict[str, str] = {}
    for stage in plan.active_stages:
        spec = devices.parse_device(stage.device)
        if str(spec) in wanted:
            placement[stage.device] = wanted[str(spec)]
        elif spec.kind == "tpu" and emulate:
            placement[stage.device] = f"emu-tpu:{spec.index or 0}"
        elif spec.kind == "cpu":
            placement[stage.device] = CPU_WORKER
        else:
            placement[stage.device] = stage.device
    _check_consecutive(plan, placement)
    return placement


def _check_consecutive(plan: Plan, placement: Mapping[str, str]) -> None:
    # A worker runs consecutive steps only (see edgecap.scheduler); the RNN step
    # and the decoder follow the last stage on their own workers.
    order = [(f"stage {s.index} ({s.device})", placement[s.device]) for s in plan.active_stages]
    order += [("the RNN step", CPU_WORKER), ("the decoder", DECODE_WORKER)]
    first: Dict[str, str] = {}
    prev = None
    for name, worker in order:
        if worker != prev and worker in first:
            raise ConfigError(
                f"devices_map puts {first[worker]} and {name} on worker {worker} with other steps "
                "between them; give each device a worker of its own, e.g. cpu:1"
            )
        first.setdefault(worker, name)
        prev = worker
