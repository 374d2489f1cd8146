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
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Hashable, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

import numpy as np

from edgecap import devices, stages
from edgecap.autoplan import PlanChoice, choose_plan
from edgecap.bundle import Bundle, WindowSpec, load_bundle
from edgecap.errors import BundleError, ConfigError, EdgecapError, PlanError
from edgecap.modelfile import open_model
from edgecap.options import CaptionerOptions
from edgecap.placement import CPU_WORKER, DECODE_WORKER, Placement, place
from edgecap.plan import Plan, Stage, load_plan, single_cpu_plan
from edgecap.preprocess import Preprocessor
from edgecap.rnn import RnnDecoder, RnnEncoder, State
from edgecap.scheduler import Pipeline, Step
from edgecap.sources import Frame, FrameSource, SourceLike, open_source, sample
from edgecap.stats import PipelineStats
from edgecap.trace import Tracer

STAGES = ("preprocess", "cnn", "rnn_step", "decode")
_log = logging.getLogger("edgecap")


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


@dataclass(frozen=True)
class FrameResult:
    """One frame of ``EdgeCaptioner.run_frames`` after every stage, with the captions it completed.

    Attributes:
      key: The stream the frame came from (e.g. a camera name).
      frame: The frame, or None for a heartbeat (see ``run_frames``).
      captions: The captions of the windows this frame completed (usually none).
      device_ms: Milliseconds of this frame's invoke on each CNN device
        (the worker's device string, e.g. ``emu-tpu:0``, ``cpu``).
    """

    key: Optional[Hashable]
    frame: Optional[Frame]
    captions: List[Caption]
    device_ms: Dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class _Run:
    """One ``stream()`` or ``run_frames()`` call: its streams' window specs (compared by identity)."""

    windows: Mapping[Hashable, WindowSpec]


@dataclass
class _FrameJob:
    """One sampled frame on its way through the pipeline; ``frame`` None is a heartbeat."""

    stream: Tuple[_Run, Optional[Hashable]]  # window state is kept per key, per run
    frame: Optional[Frame]
    tensors: Dict[str, np.ndarray]
    arrived: float
    ms: Dict[str, float]
    finished: List[Tuple["_Window", Frame]] = field(default_factory=list)
    captions: List[Caption] = field(default_factory=list)
    device_ms: Dict[str, float] = field(default_factory=dict)


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
        self._runner = stages.open_stage(stage, device, **options)
        self._device = device

    def __call__(self, job: _FrameJob) -> _FrameJob:
        if job.frame is None:  # a heartbeat passes through, proving the worker is alive
            return job
        t0 = time.perf_counter()
        job.tensors = self._runner(job.tensors)
        ms = (time.perf_counter() - t0) * 1e3
        job.ms["cnn"] += ms
        job.device_ms[self._device] = ms
        return job


class _StreamWindows:
    """The windows of one stream: frames counted so far and the windows still open."""

    def __init__(self, spec: WindowSpec) -> None:
        self.spec = spec
        self.k = 0
        self.open: Dict[int, _Window] = {}


class _RnnStep:
    """The RNN encoder step of every window a frame belongs to; owned by the CPU worker.

    Holds the step model and the state of each open window, per stream (a
    camera of the service, or the one source of ``stream()``). Frames are
    counted as they arrive, so frames a live source dropped never hold a window
    open; a new run starts from no open window.
    """

    def __init__(self, bundle: Bundle, spec: WindowSpec, pace_ms: float, feature: str,
                 quantization: Tuple[float, int]) -> None:
        self._rnn = RnnEncoder(bundle.encoder_step, 1)
        self._hidden = bundle.hidden_size
        self._spec = spec
        self._feature = feature
        self._scale, self._zero_point = quantization
        self._pace_s = pace_ms / 1000.0
        self._pacer = stages.Pacer() if pace_ms else None
        self._run: Optional[_Run] = None
        self._streams: Dict[Optional[Hashable], _StreamWindows] = {}

    def __call__(self, job: _FrameJob) -> _FrameJob:
        if job.frame is None:
            return job
        t0 = time.perf_counter()
        run, key = job.stream
        if run is not self._run:
            self._run, self._streams = run, {}
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _StreamWindows(run.windows.get(key, self._spec))
        spec = stream.spec
        k, stream.k = stream.k, stream.k + 1
        raw = job.tensors.pop(self._feature)
        if raw.dtype.kind == "f":
            feature = raw.astype(np.float32, copy=False)
        else:
            feature = (raw.astype(np.float32) - self._zero_point) * self._scale
        for n in _windows_of(k, spec):
            win = stream.open.get(n)
            if win is None:
                win = stream.open[n] = _Window(n, State.zeros(self._hidden), first=job.frame)
            ts = time.perf_counter()
            win.state = self._rnn.step(feature, win.state)
            if self._pacer is not None:
                self._pacer.wait_until(ts + self._pace_s)
            win.stage_ms["rnn_step"] += (time.perf_counter() - ts) * 1e3
            win.stage_ms["preprocess"] += job.ms["preprocess"]
            win.stage_ms["cnn"] += job.ms["cnn"]
            if k == n * spec.stride + spec.frames - 1:
                job.finished.append((stream.open.pop(n), job.frame))
        job.ms["rnn_step"] = (time.perf_counter() - t0) * 1e3
        return job


def _ends_a_window(job: _FrameJob) -> bool:
    return bool(job.finished)


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
        options: Optional[CaptionerOptions] = None,
        **overrides: Any,
    ):
        """Loads the bundle and the plan, and starts a worker thread per device.

        Args:
          bundle: A bundle directory or a loaded ``Bundle``.
          options: How to run (``CaptionerOptions``; default: its defaults).
          **overrides: Options to replace, by name (``plan=``, ``board=``,
            ``frames=``, ... as ``CaptionerOptions`` lists them).

        Raises:
          BundleError: If the bundle fails validation.
          PlanError: If the plan fails validation or does not fit the bundle.
          ConfigError: If an option is unknown or out of range.
          EdgecapError: If a device cannot be opened.
        """
        opts = (options or CaptionerOptions()).with_overrides(**overrides)
        self.options = opts
        self.bundle = bundle if isinstance(bundle, Bundle) else load_bundle(bundle)
        self.window = opts.window(self.bundle.window)
        self.plan_choice: Optional[PlanChoice] = None
        if opts.board == "auto" and opts.plan is None and not opts.reference_encoder:
            hardware = devices.detect_hardware()
            self.plan_choice = choose_plan(self.bundle, hardware, opts.on_missing_tpu)
            if self.plan_choice.fallback:
                _log.warning("edgecap: %s", self.plan_choice.reason)
            self.plan = self.plan_choice.plan
            attached: Optional[int] = len(hardware.tpus)
        else:
            self.plan = _resolve_plan(self.bundle, opts)
            attached = None
        self.placement: Placement = place(self.plan, opts.emulate, opts.devices_map, attached)
        self.devices = self.placement.workers
        model_in, model_out = self.plan.inputs[0], self.plan.outputs[0]
        self._input_name, self._output_name = model_in.name, model_out.name
        self._output_quantization = model_out.quantization
        self._preprocess = Preprocessor(
            self.bundle.input, {"dtype": np.dtype(model_in.dtype), "quantization": model_in.quantization}
        )
        self._tracer = Tracer() if opts.trace is not None else None
        self._source: Optional[FrameSource] = None
        self._closed = False
        try:
            self._pipeline = self._start()
        except EdgecapError as exc:
            choice = self.plan_choice
            if choice is None or opts.on_missing_tpu != "cpu" or not choice.board:
                raise
            # auto found a TPU that will not open (libedgetpu missing, the device
            # busy or not permitted): run on the CPU rather than not at all.
            self.plan_choice = PlanChoice(single_cpu_plan(self.bundle.encoder_model), None,
                                          f"{exc}; whole encoder on the CPU", "tpu-open-failed",
                                          choice.skipped)
            _log.warning("edgecap: %s", self.plan_choice.reason)
            self.plan = self.plan_choice.plan
            self.placement = place(self.plan, opts.emulate, opts.devices_map, 0)
            self.devices = self.placement.workers
            self._pipeline = self._start()

    def _start(self) -> Pipeline:
        """Opens every step on its worker (opening failures are raised here)."""
        opts = self.options
        return Pipeline(self._steps(), pipelined=opts.pipelined, queue_size=opts.queue_size,
                        batch=opts.batch, tracer=self._tracer)

    def _steps(self) -> List[Step]:
        steps = [self._cnn_step(s) for s in self.plan.active_stages]
        rnn_ms = (self.plan.rnn_ms or 0.0) if self.placement.pace_cpu else 0.0
        rnn = functools.partial(_RnnStep, self.bundle, self.window, rnn_ms,
                                self._output_name, self._output_quantization)
        steps.append(Step("rnn_step", CPU_WORKER, rnn))
        # The decoder sees only frames that end a window: the others pass its worker by.
        steps.append(Step("decode", DECODE_WORKER, functools.partial(_Decode, self.bundle),
                          accepts=_ends_a_window))
        return steps

    def _cnn_step(self, stage: Stage) -> Step:
        device = self.devices[stage.device]
        on_cpu = stage.spec.kind == "cpu"
        pace = on_cpu and self.placement.pace_cpu
        if pace:
            # The board's CPU stage time includes the RNN steps (one per window the
            # frame feeds), which _RnnStep paces on its own, step by step.
            stage = dataclasses.replace(stage, predicted_ms=max(0.0, stage.predicted_ms - self.plan.rnn_frame_ms))
        threads = (self.options.num_threads or devices.cpu_cores()) if on_cpu else 1
        opener = functools.partial(
            _CnnStage, stage, device, num_threads=threads,
            timing_only=self.options.timing_only, pace=pace,
        )
        return Step(f"stage {stage.index} ({stage.device})", device, opener)

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
        stream = (_Run({}), None)
        for frame in sample(src, self.window.sample_fps):
            yield self._job(stream, frame)

    def _job(self, stream: Tuple[_Run, Optional[Hashable]], frame: Frame) -> _FrameJob:
        t0 = time.perf_counter()
        x = self._preprocess(frame.image)
        ms = dict.fromkeys(STAGES, 0.0)
        ms["preprocess"] = (time.perf_counter() - t0) * 1e3
        return _FrameJob(stream, frame, {self._input_name: x}, t0, ms)

    def run_frames(
        self,
        frames: Iterable[Tuple[Optional[Hashable], Optional[Frame]]],
        windows: Optional[Mapping[Hashable, WindowSpec]] = None,
        live: bool = True,
    ) -> Iterator[FrameResult]:
        """Runs frames of several streams (e.g. cameras) through the one pipeline, interleaved.

        Every stream shares the device workers; the RNN keeps each stream's
        windows apart, so a caption only ever reads frames of its own stream.
        The frames must already be sampled (one per window step). A ``(key,
        None)`` item is a heartbeat: it passes every worker without work and
        comes out as a ``FrameResult`` with no frame, so a consumer hears from
        a healthy pipeline even while no stream has frames, and stops hearing
        when a worker hangs.

        Args:
          frames: ``(key, frame)`` pairs, e.g. from the service's camera mux.
            Iterated on the pipeline's feeder thread.
          windows: A window spec per key (default: the captioner's window).
          live: Keep only the newest waiting frame and count the others as
            drops, instead of blocking the source (cameras).

        Returns:
          One ``FrameResult`` per frame (and heartbeat), in input order.

        Raises:
          EdgecapError: If the captioner is closed; RunCancelled if it is
            closed while the run is going on.
        """
        if self._closed:
            raise EdgecapError("this EdgeCaptioner is closed; create a new one to caption more video")
        run = _Run(dict(windows or {}))  # this run's own: a refused run changes nothing

        def jobs() -> Iterator[_FrameJob]:
            for key, frame in frames:
                if frame is None:
                    yield _FrameJob((run, key), None, {}, time.perf_counter(), dict.fromkeys(STAGES, 0.0))
                else:
                    yield self._job((run, key), frame)

        results = self._pipeline.run(jobs(), live=live)
        self._source = None
        try:
            for job in results:
                yield FrameResult(job.stream[1], job.frame, job.captions, job.device_ms)
        finally:
            results.close()
            self._write_trace()

    def stats(self) -> Optional[PipelineStats]:
        """Statistics of the current or latest stream (None before the first).

        ``dropped`` counts frames a live source or the pipeline discarded;
        ``thermal`` the temperature and throttling of the EdgeTPUs the plan
        runs on (real ones only; emulated TPUs have none).
        """
        stats = self._pipeline.stats()
        if stats is None:
            return stats
        if self._source is not None:
            stats = dataclasses.replace(stats, dropped=stats.dropped + self._source.dropped)
        if any(devices.parse_device(w).kind == "tpu" for w in self.devices.values()):
            stats = dataclasses.replace(stats, thermal=tuple(devices.tpu_thermals()))
        return stats

    def close(self) -> None:
        """Stops the run in progress and joins every worker thread; idempotent."""
        self._closed = True
        self._pipeline.close()
        self._write_trace()

    def _write_trace(self) -> None:
        if self._tracer is not None:
            self._tracer.write(self.options.trace)

    def __enter__(self) -> "EdgeCaptioner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _resolve_plan(bundle: Bundle, opts: CaptionerOptions) -> Plan:
    if opts.reference_encoder:
        if bundle.reference_encoder is None:
            raise ConfigError(f"{bundle.root}: bundle has no reference_encoder; "
                              "re-export it with the float encoder")
        try:
            model, _ = open_model(bundle.reference_encoder)
        except (ValueError, RuntimeError, OSError) as exc:
            raise BundleError(f"{bundle.reference_encoder}: not a TFLite model ({exc}); "
                              "re-export the bundle") from None
        return single_cpu_plan(model)
    if isinstance(opts.plan, Plan):
        resolved = opts.plan
    elif opts.plan is not None:
        resolved = load_plan(opts.plan)
    else:
        from edgecap.planning import plan_for_board  # the one door to the compiler

        resolved = plan_for_board(bundle, opts.board)
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
    if plan.model_sha256 != bundle.encoder_model.sha256:
        raise PlanError(
            f"{plan.path or 'plan'}: compiled from another model than {bundle.encoder} "
            f"(sha256 differs); re-run `edgecap compile {bundle.root}`"
        )
