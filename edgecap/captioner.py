"""The captioning API: ``EdgeCaptioner`` turns a video source into ``Caption`` records.

Every sampled frame goes through the plan's CNN stages (each on its device's
worker thread), then the RNN encoder step of every window the frame belongs
to (on the CPU worker), then, when a window is complete, the beam-search
decoder (on a worker of its own, so decoding never stalls the CNN). The scheduler
(``edgecap.scheduler``) runs these steps pipelined across frames.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

import numpy as np

from edgecap import devices, emulation, faults, planner, stages
from edgecap.bundle import Bundle, WindowSpec, load_bundle
from edgecap.events import Event, EventRule, EventTracker
from edgecap.errors import ConfigError, DeviceFailed, EdgecapError, RunCancelled, RunFailure, StageFailed
from edgecap.isolation import IsolatedSegment
from edgecap.options import CaptionerOptions
from edgecap.plans.plan import Plan
from edgecap.planner import TPU_KINDS, Choice, StageRun
from edgecap.preprocess import Preprocessor
from edgecap.rethread import Rethreaded
from edgecap.rnn import RnnDecoder, RnnEncoder, State
from edgecap.scheduler import Pipeline, Replicas, Step
from edgecap.sources import Frame, FrameSource, SourceLike, open_source, sample
from edgecap.stats import PipelineStats
from edgecap.supervisor import Run, Supervisor
from edgecap.trace import Tracer

STAGES = ("preprocess", "cnn", "rnn_step", "decode")


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
      confidence: Mean log-probability of its tokens and eos (<= 0; nearer 0
        is surer).
      scene: ``known`` or ``unknown`` (a scene unlike the bundle's world, by
        its calibration: the text is then a guess in that world's words), or
        None when the bundle has no calibration to tell by (``edgecap.domain``).
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
    confidence: float = 0.0
    scene: Optional[str] = None

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
      board_ms: The same as the board takes them, and the RNN steps'
        (``rnn_step``): measured on real devices; on an emulated one its
        paced time (modelled), without what this host added.
    """

    key: Optional[Hashable]
    frame: Optional[Frame]
    captions: List[Caption]
    device_ms: Dict[str, float] = field(default_factory=dict)
    board_ms: Dict[str, float] = field(default_factory=dict)


@dataclass
class _FrameJob:
    """One sampled frame on its way through the pipeline; ``frame`` None is a heartbeat."""

    stream: Tuple[Run, Optional[Hashable]]  # window state is kept per key, per run
    frame: Optional[Frame]
    tensors: Dict[str, np.ndarray]
    arrived: float
    ms: Dict[str, float]
    pos: int = 0  # place in the call's input, kept when the frame is replayed after a failover
    finished: List[Tuple["_Window", Frame]] = field(default_factory=list)
    captions: List[Caption] = field(default_factory=list)
    device_ms: Dict[str, float] = field(default_factory=dict)
    board_ms: Dict[str, float] = field(default_factory=dict)  # FrameResult.board_ms


@dataclass
class _Window:
    number: int
    state: State
    first: Frame
    stage_ms: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    feature_sum: Optional[np.ndarray] = None  # of its frames' features, where the calibration reads their mean
    features: int = 0


def _windows_of(k: int, spec: WindowSpec) -> range:
    """Window numbers whose span of sampled frames contains sample ``k``."""
    first = max(0, -(-(k - spec.frames + 1) // spec.stride))
    return range(first, k // spec.stride + 1)


class _CnnStage:
    """One plan stage of the CNN on its worker, as the planner's ``StageRun`` says; owned by that worker.

    On an EdgeTPU (real or emulated) it is where injected faults strike
    (``edgecap.faults``), and any error of the invoke is a ``DeviceFailed``,
    which the supervisor fails over from.
    """

    def __init__(self, run: StageRun, released: threading.Event) -> None:
        if run.isolate:
            self._runner: Any = IsolatedSegment(
                run.stage, run.worker, num_threads=run.threads, timing_only=not run.compute,
                pace_ms=run.pace_ms, deadline_s=run.deadline_s, first_deadline_s=run.first_deadline_s)
        elif run.recheck is not None:  # a host CNN on every core: its threads re-checked as it runs
            self._runner = Rethreaded(run.recheck, run.threads, functools.partial(self._open, run))
        else:
            self._runner = self._open(run, run.threads)
        self._device = str(run.worker)
        self._tpu = run.worker.kind in TPU_KINDS
        self._isolated = run.isolate
        self._released = released

    @staticmethod
    def _open(run: StageRun, threads: int) -> Any:
        return stages.open_stage(run.stage, run.worker, num_threads=threads, timing_only=not run.compute,
                                 pace_ms=run.pace_ms, bus=run.bus)

    def __call__(self, job: _FrameJob) -> _FrameJob:
        if job.frame is None:  # a heartbeat passes through, proving the worker is alive
            return job
        t0 = time.perf_counter()
        job.tensors = self._invoke(job.tensors) if self._tpu else self._runner(job.tensors)
        ms = (time.perf_counter() - t0) * 1e3
        job.ms["cnn"] += ms
        job.device_ms[self._device] = ms
        paced = getattr(self._runner, "paced_ms", None)  # the board's time of a paced stage, isolated or not
        job.board_ms[self._device] = ms if paced is None else paced
        return job

    def _invoke(self, tensors: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        plan = faults.current()
        fault = plan.take(self._device) if plan else None
        try:
            if self._isolated:  # the worker process performs it, so an abort kills only the worker
                return self._runner(tensors, fault=fault)
            if fault is not None:
                # An emulated hang ends when this pipeline is replaced or closed.
                faults.perform(fault, self._released)
            return self._runner(tensors)
        except (DeviceFailed, RunCancelled):  # a stopped run is no device failure
            raise
        except Exception as exc:  # whatever the delegate raised: the device is unusable
            raise DeviceFailed(self._device, "error", f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        """Releases the stage (an isolated one's worker process); called by its worker thread as it exits."""
        self._runner.close()


class _Guarded:
    """A step that turns an exception no device explains into a one-line ``StageFailed``.

    An EdgeTPU stage's errors are ``DeviceFailed`` already (failed over); an
    exception of a CPU stage, the RNN step or the decoder (a bug, a native
    error, memory) would otherwise reach the caller as a bare traceback.
    """

    __slots__ = ("_fn", "_step", "_worker")

    def __init__(self, fn: Callable[[Any], Any], step: str, worker: str) -> None:
        self._fn, self._step, self._worker = fn, step, worker

    def __call__(self, job: Any) -> Any:
        try:
            return self._fn(job)
        except (EdgecapError, RunFailure):  # DeviceFailed, RunCancelled: the supervisor's to handle
            raise
        except Exception as exc:
            raise StageFailed(self._step, self._worker, exc) from exc

    def close(self) -> None:
        """Closes the step, as its worker thread does when it ends."""
        close = getattr(self._fn, "close", None)
        if close is not None:
            close()


def _guarded(step: str, worker: str, open_: Callable[[], Callable[[Any], Any]]) -> Callable[[], _Guarded]:
    """A ``Step.open`` that opens ``open_`` and guards what it returns (see ``_Guarded``)."""
    return lambda: _Guarded(open_(), step, worker)


class _StreamWindows:
    """The windows of one stream: frames counted so far and the windows still open."""

    def __init__(self, spec: WindowSpec, k: int = 0, first: int = 0) -> None:
        self.spec = spec
        self.k = k
        self.first = first  # windows before it are not opened (see Run.resume)
        self.open: Dict[int, _Window] = {}


class _Preprocess:
    """Resizes, converts and quantizes each frame to the CNN's input, on the worker the choice names.

    A board's on a worker of its own, off the feeder thread that reads the
    source, so that decoding a frame and preprocessing the one before it
    overlap on its cores; a host's on the feeder, as it reads, beside the
    models' worker (``Choice.preprocess_worker``). It holds nothing bound to a thread.
    """

    def __init__(self, preprocess: Preprocessor, input_name: str) -> None:
        self._preprocess = preprocess
        self._input_name = input_name

    def __call__(self, job: _FrameJob) -> _FrameJob:
        if job.frame is None:  # a heartbeat
            return job
        t0 = time.perf_counter()
        job.tensors = {self._input_name: self._preprocess(job.frame.image)}
        job.ms["preprocess"] = (time.perf_counter() - t0) * 1e3
        return job


class _RnnStep:
    """The RNN encoder step of every window a frame belongs to; owned by the CPU worker.

    Holds the step model and the state of each open window, per stream (a
    camera of the service, or the one source of ``stream()``). Frames are
    counted as they arrive, so frames a live source dropped never hold a window
    open; a new run starts from no open window.
    """

    def __init__(self, bundle: Bundle, spec: WindowSpec, pace_ms: float, feature: str,
                 quantization: Tuple[float, int], compute: bool = True, float_rnn: bool = False,
                 frame_pace_ms: float = 0.0) -> None:
        # A timing-only board run paces the step and computes nothing, as its
        # emulated TPUs do: the host's LSTM may be slower than the board's model.
        self._rnn = RnnEncoder(bundle.steps(float_rnn).encoder_step, 1) if compute else None
        self._hidden = bundle.hidden_size
        self._spec = spec
        self._feature = feature
        self._scale, self._zero_point = quantization
        self._pace_s = pace_ms / 1000.0
        # The emulated board CPU's own work a frame (Choice.frame_pace_ms): time taken, not a step's.
        self._frame_pace_s = frame_pace_ms / 1000.0
        self._pacer = stages.Pacer() if pace_ms or frame_pace_ms else None
        # The emulated board's CPU may run at another speed than profiled (edgecap.emulation).
        self._cpu_truth = emulation.current().get("cpu") if self._pacer is not None else None
        self._run: Optional[Run] = None
        self._streams: Dict[Optional[Hashable], _StreamWindows] = {}
        self._sum_features = bundle.calibration is not None and bundle.calibration.feature is not None
        self._tables: Dict[np.dtype, np.ndarray] = {}

    def _dequantize(self, dtype: np.dtype) -> np.ndarray:
        """The float32 feature of each byte of an 8-bit output, indexed by the byte: the same sums, once."""
        table = self._tables.get(dtype)
        if table is None:
            values = np.arange(256, dtype=np.uint8).view(dtype)
            table = self._tables[dtype] = (values.astype(np.float32) - self._zero_point) * self._scale
        return table

    def __call__(self, job: _FrameJob) -> _FrameJob:
        if job.frame is None:
            return job
        t0 = time.perf_counter()
        if self._frame_pace_s:
            speed = 1.0 if self._cpu_truth is None else emulation.speed_now(self._cpu_truth, "cpu", t0)
            self._pacer.wait_until(t0 + self._frame_pace_s / speed)
        run, key = job.stream
        if run is not self._run:
            self._run, self._streams = run, {}
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _StreamWindows(run.windows.get(key, self._spec),
                                                         *run.resume.get(key, (0, 0)))
        spec = stream.spec
        k, stream.k = stream.k, stream.k + 1
        board = 0.0  # the steps' time as the board takes them (see FrameResult.board_ms)
        raw = job.tensors.pop(self._feature)
        if raw.dtype.kind == "f":
            feature = raw.astype(np.float32, copy=False)
        elif raw.itemsize == 1:  # one lookup a frame instead of three array operations
            feature = self._dequantize(raw.dtype)[raw.view(np.uint8)]
        else:
            feature = (raw.astype(np.float32) - self._zero_point) * self._scale
        ms = job.ms
        opened = stream.open
        for n in _windows_of(k, spec):
            if n < stream.first:
                continue
            win = opened.get(n)
            if win is None:
                win = opened[n] = _Window(n, State.zeros(self._hidden), first=job.frame)
            ts = time.perf_counter()
            if self._rnn is not None:
                win.state = self._rnn.step(feature, win.state)
            if self._pace_s:
                speed = 1.0 if self._cpu_truth is None else emulation.speed_now(self._cpu_truth, "cpu", ts)
                self._pacer.wait_until(ts + self._pace_s / speed)
                board += self._pace_s / speed * 1e3
                step_ms = (time.perf_counter() - ts) * 1e3
            else:
                step_ms = (time.perf_counter() - ts) * 1e3
                board += step_ms
            spent = win.stage_ms
            spent["rnn_step"] += step_ms
            spent["preprocess"] += ms["preprocess"]
            spent["cnn"] += ms["cnn"]
            if self._sum_features:
                flat = feature.reshape(-1)
                win.feature_sum = flat.astype(np.float64) if win.feature_sum is None else win.feature_sum + flat
                win.features += 1
            if k == n * spec.stride + spec.frames - 1:
                job.finished.append((opened.pop(n), job.frame))
        ms["rnn_step"] = (time.perf_counter() - t0) * 1e3
        job.board_ms["rnn_step"] = board
        return job


def _ends_a_window(job: _FrameJob) -> bool:
    return bool(job.finished)


class _Decode:
    """The beam-search decoder of finished windows; owned by the decode worker."""

    def __init__(self, bundle: Bundle, beam: int, float_rnn: bool = False) -> None:
        self._decoder = RnnDecoder(bundle.steps(float_rnn).decoder_step, 1)
        self._bundle = bundle
        self._beam = beam

    def __call__(self, job: _FrameJob) -> _FrameJob:
        tok = self._bundle.tokens
        for win, last in job.finished:
            t = time.perf_counter()
            decoded = self._decoder.decode(win.state, tok.bos, tok.eos,
                                           self._bundle.max_caption_length, self._beam)
            done = time.perf_counter()
            win.stage_ms["decode"] = (done - t) * 1e3
            job.captions.append(
                Caption(
                    text=self._bundle.detokenize(decoded.tokens),
                    tokens=decoded.tokens,
                    window=win.number,
                    start_frame=win.first.index,
                    end_frame=last.index,
                    start_time=win.first.timestamp,
                    end_time=last.timestamp,
                    stage_ms={k: round(v, 3) for k, v in win.stage_ms.items()},
                    latency_ms=round((done - job.arrived) * 1e3, 3),
                    confidence=round(decoded.confidence, 6),
                    scene=self._scene(decoded.confidence, win),
                )
            )
        job.finished = []
        return job

    def _scene(self, confidence: float, win: _Window) -> Optional[str]:
        calibration = self._bundle.calibration
        if calibration is None:
            return None
        mean = None if win.feature_sum is None else win.feature_sum / win.features
        return calibration.scene(confidence, mean)


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
        choice = planner.choose(self.bundle, opts)
        # Before anything opens: a fault for a device this board lacks could never fire.
        pending = faults.current()
        if pending:
            pending.check(planner.board_tpus(choice))
        truth = emulation.current()  # a malformed truth is refused here, not by a worker opening its stage
        if truth.devices:  # one for a device this run lacks could never apply: refused, not ignored
            if not choice.emulated:
                raise ConfigError(f"{emulation.ENV}: this run emulates no board (its plan runs on "
                                  f"{', '.join(sorted(set(s.device for s in choice.plan.stages)))}); unset it, or "
                                  "run an emulated board (devices emu-tpu:N)")
            emulation.resolve(truth, choice.plan)
        model_in, model_out = choice.plan.inputs[0], choice.plan.outputs[0]
        self._input_name, self._output_name = model_in.name, model_out.name
        self._output_quantization = model_out.quantization
        self._preprocess = Preprocessor(
            self.bundle.input, {"dtype": np.dtype(model_in.dtype), "quantization": model_in.quantization}
        )
        self._tracer = Tracer() if opts.trace is not None else None
        self._closed = False
        self._source: Optional[FrameSource] = None  # of the stream in progress
        try:
            self._supervisor = Supervisor(self.bundle, opts, choice, self._open, self._tracer)
        except EdgecapError as exc:
            instead = planner.cpu_instead(self.bundle, opts, choice, exc)
            if instead is None:
                raise
            self._supervisor = Supervisor(self.bundle, opts, instead, self._open, self._tracer)

    @property
    def choice(self) -> Choice:
        """What runs where now (``edgecap.planner.Choice``): the plan, its workers, each stage's settings."""
        return self._supervisor.choice

    @property
    def plan(self) -> Plan:
        """The running plan."""
        return self.choice.plan

    @property
    def devices(self) -> Dict[str, str]:
        """Plan device -> the device string of the worker that runs it, e.g. ``{"tpu:0": "emu-tpu:0"}``."""
        return {device: str(worker) for device, worker in self.choice.workers.items()}

    def _open(self, choice: Choice, released: threading.Event) -> Pipeline:
        """Opens every step of a choice on its worker (opening failures are raised here)."""
        worker = choice.preprocess_worker
        preprocess = functools.partial(_Preprocess, self._preprocess, self._input_name)
        steps = [Step("preprocess", worker, _guarded("preprocess", worker, preprocess))]
        for run in choice.stages:
            step = Step(run.name, str(run.worker), _guarded(run.name, str(run.worker),
                                                             functools.partial(_CnnStage, run, released)),
                        deadline_s=run.deadline_s, first_deadline_s=run.first_deadline_s, weight=run.share)
            if not run.copy:
                steps.append(step)
            else:  # the copies of one stage: dealt frames by share, put back in order before the RNN
                first = steps.pop()
                steps.append(Replicas((*(first.copies if isinstance(first, Replicas) else (first,)), step)))
        rnn = functools.partial(_RnnStep, self.bundle, self.window, choice.rnn_pace_ms, self._output_name,
                                self._output_quantization, compute=choice.rnn_compute,
                                float_rnn=self.options.float_rnn, frame_pace_ms=choice.frame_pace_ms)
        steps.append(Step("rnn_step", str(planner.CPU), _guarded("rnn_step", str(planner.CPU), rnn)))
        # The decoder sees only frames that end a window: the others pass its worker by.
        decode = functools.partial(_Decode, self.bundle, self.options.beam, self.options.float_rnn)
        steps.append(Step("decode", planner.DECODE_WORKER,
                          _guarded("decode", planner.DECODE_WORKER, decode), accepts=_ends_a_window))
        return Pipeline(steps, pipelined=choice.pipelined, queue_size=self.options.queue_size,
                        batch=choice.batch, tracer=self._tracer)

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
        jobs = self._source_jobs(source, fps)
        try:
            for job in jobs:
                yield from job.captions
        finally:
            jobs.close()  # now, not at garbage collection: the source and the run end with the caller

    def events(self, source: SourceLike, fps: Optional[float] = None, camera: str = "",
               rule: Optional[EventRule] = None) -> Iterator[Event]:
        """Yields each ``Event`` as it closes, and the last one when the source ends.

        Consecutive windows with near-same captions merge into one event by
        ``rule`` (docs/runtime.md, "Events"); times are the source's
        timestamps, thumbnails come from the frames. Reading, dropping and
        stopping work as in ``stream()``.

        Args:
          source: As for ``stream()``.
          fps: As for ``stream()``.
          camera: The name the events carry (their ids are ``CAMERA@START_MS``).
          rule: The event rule (default ``EventRule()``).

        Raises:
          SourceError: If the source cannot be opened or read.
          EdgecapError: If the captioner is closed.
        """
        tracker = EventTracker(camera, rule)
        jobs = self._source_jobs(source, fps)
        try:
            for job in jobs:
                for caption in job.captions:
                    image = job.frame.image if job.frame is not None else None
                    for event, change in tracker.update(caption, image):
                        if change == "closed":
                            yield event
        finally:
            jobs.close()  # now, not at garbage collection: the source and the run end with the caller
        for event, _ in tracker.close():
            yield event

    def _source_jobs(self, source: SourceLike, fps: Optional[float]) -> Iterator[_FrameJob]:
        """The finished jobs of one source's run (``stream()`` and ``events()`` read them)."""
        if self._closed:
            raise EdgecapError("this EdgeCaptioner is closed; create a new one to caption more video")
        in_memory_rate = fps or self.window.sample_fps or 30.0
        src = open_source(source, fps=in_memory_rate, decode_threads=self.choice.decode_threads)
        self._source = src  # closed by close() from another thread: a read that blocks ends at once
        frames = sample(src, self.window.sample_fps)
        try:
            # Not ``yield from``: a caller that stops reading closes the source
            # before the run's generator, as it always has.
            for job in self._supervisor.run(((None, f) for f in frames), {}, src.live, src, self._job):
                yield job
        except (KeyboardInterrupt, GeneratorExit):
            # A camera has no end of its own: Ctrl-C, or a caller that stops
            # reading, is how its run ends, so its trace is written; a file's
            # run cut short is not a run that succeeded, and writes none.
            if src.live:
                self._write_trace()
            raise
        finally:
            try:
                frames.close()
            except ValueError:  # "generator already executing": the feeder's read returns into a closed source
                pass
            src.close()
            self._source = None
        if self._closed:  # the source ended because close() closed it: not a stream that finished
            raise RunCancelled("the run was stopped by close() before its end; start a new run to process more")
        self._write_trace()

    def _job(self, stream: Tuple[Run, Optional[Hashable]], frame: Optional[Frame], pos: int) -> _FrameJob:
        # Runs on the pipeline's feeder thread, which only reads: the preprocess step comes next.
        return _FrameJob(stream, frame, {}, time.perf_counter(), dict.fromkeys(STAGES, 0.0), pos)

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
        for job in self._supervisor.run(iter(frames), dict(windows or {}), live, None, self._job):
            yield FrameResult(job.stream[1], job.frame, job.captions, job.device_ms, job.board_ms)
        self._write_trace()

    def stats(self) -> Optional[PipelineStats]:
        """Statistics of the current or latest stream (None before the first).

        ``dropped`` counts frames a live source or the pipeline discarded;
        ``thermal`` the temperature and throttling of the EdgeTPUs the plan
        runs on (real ones only; emulated TPUs have none).
        """
        stats = self._supervisor.stats()
        if stats is not None and any(w.kind == "tpu" for w in self.choice.workers.values()):
            stats = dataclasses.replace(stats, thermal=tuple(devices.tpu_thermals()))
        return stats

    def close(self) -> None:
        """Stops the run in progress and joins every worker thread; idempotent, from any thread.

        A ``stream()`` waiting on its source (a camera, or a generator of the
        caller's that blocks) ends at once with ``RunCancelled``.
        """
        self._closed = True
        source = self._source
        if source is not None:  # first: the feeder waiting on it returns before the pipeline joins it
            source.close()
        self._supervisor.close()

    def _write_trace(self) -> None:
        # Only a run that reached the end of its frames (or a camera's run, which
        # ends by an interrupt) writes the trace: a run that failed, or a file's run
        # that was interrupted or stopped early, writes none (docs/runtime.md).
        if self._tracer is not None:
            self._tracer.write(self.options.trace)

    def __enter__(self) -> "EdgeCaptioner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
