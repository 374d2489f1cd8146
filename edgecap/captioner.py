"""The captioning API: ``EdgeCaptioner`` turns a video source into ``Caption`` records.

Every sampled frame goes through the plan's CNN stages (each on its device's
worker thread), then the RNN encoder step of every window the frame belongs
to (on the CPU worker), then, when a window is complete, the greedy decoder
(on a worker of its own, so decoding never stalls the CNN). The scheduler
(``edgecap.scheduler``) runs these steps pipelined across frames.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, Hashable, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

import numpy as np

from edgecap import devices, faults, isolation, stages
from edgecap.autoplan import PlanChoice, choose_plan
from edgecap.bundle import Bundle, WindowSpec, load_bundle
from edgecap.errors import BundleError, ConfigError, DeviceFailed, EdgecapError, PlanError, RunCancelled
from edgecap.failover import TPU_KINDS, Prober, Replan, board_tpus, bundle_plans, describe, replan
from edgecap.modelfile import open_model
from edgecap.options import FIRST_INVOKE_GRACE, CaptionerOptions
from edgecap.placement import CPU_WORKER, DECODE_WORKER, Placement, place
from edgecap.plan import Plan, Stage, check_segments, load_plan, single_cpu_plan
from edgecap.preprocess import Preprocessor
from edgecap.rnn import RnnDecoder, RnnEncoder, State
from edgecap.scheduler import Pipeline, Step
from edgecap.sources import Frame, FrameSource, SourceLike, open_source, sample
from edgecap.stats import FailoverRecord, PipelineStats
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
    """One pipeline run of a ``stream()`` or ``run_frames()`` call (compared by identity).

    Attributes:
      windows: The window spec of each stream (key).
      resume: Per stream, after a failover: the sample number its first
        frame in this run has, and the first window to open (the earlier
        ones were captioned, or are lost in live mode).
    """

    windows: Mapping[Hashable, WindowSpec]
    resume: Mapping[Hashable, Tuple[int, int]] = field(default_factory=dict)


@dataclass
class _FrameJob:
    """One sampled frame on its way through the pipeline; ``frame`` None is a heartbeat."""

    stream: Tuple[_Run, Optional[Hashable]]  # window state is kept per key, per run
    frame: Optional[Frame]
    tensors: Dict[str, np.ndarray]
    arrived: float
    ms: Dict[str, float]
    pos: int = 0  # place in the call's input, kept when the frame is replayed after a failover
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
    """One plan stage of the CNN on its device; owned by that device's worker.

    On an EdgeTPU (real or emulated) it is where injected faults strike
    (``edgecap.faults``), and any error of the invoke is a ``DeviceFailed``,
    which the captioner fails over from.
    """

    def __init__(self, stage: Stage, device: str, released: threading.Event, **options: Any) -> None:
        self._runner = stages.open_stage(stage, device, **options)
        self._device = device
        self._tpu = devices.parse_device(device).kind in TPU_KINDS
        self._isolated = bool(getattr(self._runner, "isolated", False))
        self._released = released

    def __call__(self, job: _FrameJob) -> _FrameJob:
        if job.frame is None:  # a heartbeat passes through, proving the worker is alive
            return job
        t0 = time.perf_counter()
        if self._tpu:
            job.tensors = self._invoke(job.tensors)
        else:
            job.tensors = self._runner(job.tensors)
        ms = (time.perf_counter() - t0) * 1e3
        job.ms["cnn"] += ms
        job.device_ms[self._device] = ms
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


class _StreamWindows:
    """The windows of one stream: frames counted so far and the windows still open."""

    def __init__(self, spec: WindowSpec, k: int = 0, first: int = 0) -> None:
        self.spec = spec
        self.k = k
        self.first = first  # windows before it are not opened (see _Run.resume)
        self.open: Dict[int, _Window] = {}


class _RnnStep:
    """The RNN encoder step of every window a frame belongs to; owned by the CPU worker.

    Holds the step model and the state of each open window, per stream (a
    camera of the service, or the one source of ``stream()``). Frames are
    counted as they arrive, so frames a live source dropped never hold a window
    open; a new run starts from no open window.
    """

    def __init__(self, bundle: Bundle, spec: WindowSpec, pace_ms: float, feature: str,
                 quantization: Tuple[float, int], compute: bool = True) -> None:
        # A timing-only board run paces the step and computes nothing, as its
        # emulated TPUs do: the host's LSTM may be slower than the board's model.
        self._rnn = RnnEncoder(bundle.encoder_step, 1) if compute else None
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
            stream = self._streams[key] = _StreamWindows(run.windows.get(key, self._spec),
                                                         *run.resume.get(key, (0, 0)))
        spec = stream.spec
        k, stream.k = stream.k, stream.k + 1
        raw = job.tensors.pop(self._feature)
        if raw.dtype.kind == "f":
            feature = raw.astype(np.float32, copy=False)
        else:
            feature = (raw.astype(np.float32) - self._zero_point) * self._scale
        for n in _windows_of(k, spec):
            if n < stream.first:
                continue
            win = stream.open.get(n)
            if win is None:
                win = stream.open[n] = _Window(n, State.zeros(self._hidden), first=job.frame)
            ts = time.perf_counter()
            if self._rnn is not None:
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


def _resume_point(consumed: int, spec: WindowSpec, live: bool) -> Tuple[int, int, int]:
    """Where a stream resumes on a new pipeline after ``consumed`` of its frames came out.

    Returns:
      ``(k, first, lost)``: the sample number to resume at, the first window
      to open, and the windows lost. In file mode it resumes at the start of
      the earliest window not yet captioned (nothing lost); in live mode at the
      next frame, losing the windows open then.
    """
    earliest = max(0, -(-(consumed - spec.frames + 1) // spec.stride))  # not yet captioned
    if not live:
        return min(earliest * spec.stride, consumed), earliest, 0
    first = -(-consumed // spec.stride)
    return consumed, first, max(0, first - earliest)


class _Source:
    """The input of one ``stream()`` or ``run_frames()`` call, read once, held for replays.

    Each pipeline run's feeder reads it through ``jobs``; the consumer reports
    every job that came out (``consumed``). With ``hold`` (file mode) it keeps,
    per stream, the jobs from the first frame of its earliest window not yet
    captioned on, so that after a failover a new pipeline runs them again.
    """

    def __init__(self, items: Iterator[Tuple[Optional[Hashable], Optional[Frame]]],
                 make_job: Callable[..., _FrameJob], windows: Mapping[Hashable, WindowSpec],
                 default: WindowSpec, hold: bool) -> None:
        self._items = items
        self._make_job = make_job
        self._windows, self._default = windows, default
        self._hold = hold
        # Reads are serialised: a replaced pipeline's feeder may still be in one.
        self._read_lock = threading.Lock()
        self._lock = threading.Lock()  # the held jobs: the feeder adds, the consumer trims
        self._held: Dict[Optional[Hashable], Deque[Tuple[int, _FrameJob]]] = {}
        self._counts: Dict[Optional[Hashable], int] = {}  # frames read, per stream
        self._pos = 0
        self._read = 0
        self._generation = 0  # of the newest jobs(): a replaced run's feeder stops reading
        self._ended = False
        self.consumed_frames: Dict[Optional[Hashable], int] = {}
        self.next_out = 0

    def jobs(self, run: _Run, resume: Mapping[Hashable, Tuple[int, int]]) -> Iterator[_FrameJob]:
        """The jobs of one pipeline run: the held ones from each stream's resume point, then new ones.

        From this call on, the generator of an earlier run reads no more: a
        replaced pipeline's feeder could otherwise take a frame the new run
        never sees.
        """
        with self._read_lock:  # waits out a read of the replaced pipeline's feeder
            self._generation += 1
            generation = self._generation
        return self._jobs(run, resume, generation)

    def _jobs(self, run: _Run, resume: Mapping[Hashable, Tuple[int, int]],
              generation: int) -> Iterator[_FrameJob]:
        with self._read_lock:
            with self._lock:
                again = sorted((job for key, held in self._held.items() for k, job in held
                                if k >= resume.get(key, (0, 0))[0]), key=lambda job: job.pos)
        for job in again:
            yield dataclasses.replace(job, stream=(run, job.stream[1]), tensors=dict(job.tensors),
                                      ms=dict(job.ms), finished=[], captions=[], device_ms={})
        while True:
            with self._read_lock:
                if self._ended or generation != self._generation:
                    return
                try:
                    key, frame = next(self._items)
                except StopIteration:
                    self._ended = True
                    return
                job = self._make_job((run, key), frame, self._pos)
                self._pos += 1
                if frame is not None:
                    self._read += 1
                    k = self._counts.get(key, 0)
                    self._counts[key] = k + 1
                    if self._hold:  # a pristine copy: the stages replace tensors and add to ms
                        held = dataclasses.replace(job, tensors=dict(job.tensors), ms=dict(job.ms))
                        with self._lock:
                            self._held.setdefault(key, collections.deque()).append((k, held))
            yield job

    def consumed(self, job: _FrameJob) -> bool:
        """Counts a job that came out; False for one that came out before a failover (not yielded again)."""
        if job.pos < self.next_out:
            return False
        self.next_out = job.pos + 1
        if job.frame is not None:
            key = job.stream[1]
            c = self.consumed_frames[key] = self.consumed_frames.get(key, 0) + 1
            if self._hold:
                start = _resume_point(c, self._windows.get(key, self._default), False)[0]
                with self._lock:
                    held = self._held[key]
                    while held and held[0][0] < start:
                        held.popleft()
        return True

    def resume(self, live: bool) -> Tuple[Dict[Hashable, Tuple[int, int]], int]:
        """Each stream's resume point (``_Run.resume``) and the windows lost, for a new pipeline."""
        resume, lost = {}, 0
        for key, c in self.consumed_frames.items():
            k, first, gone = _resume_point(c, self._windows.get(key, self._default), live)
            resume[key] = (k, first)
            lost += gone
        return resume, lost

    def replay_count(self, resume: Mapping[Hashable, Tuple[int, int]]) -> int:
        """Held frames a run from ``resume`` runs again."""
        with self._lock:
            return sum(1 for key, held in self._held.items() for k, _ in held
                       if k >= resume.get(key, (0, 0))[0])

    def in_flight(self) -> int:
        """Frames read that did not come out (lost in live mode)."""
        return self._read - sum(self.consumed_frames.values())


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
        # Failover state: the devices that failed, those a re-probe found back,
        # the pipelines replaced (joined on close), and this call's records.
        self._release = threading.Event()  # ends the current pipeline's emulated hangs
        self._failed: List[str] = []
        self._returned: List[str] = []
        # Reentrant: close() may run in a signal handler that interrupted this thread holding it.
        self._lock = threading.RLock()
        self._prober = Prober(self._on_return)
        self._retired: List[Pipeline] = []
        self._failovers: List[FailoverRecord] = []
        self._carried = (0, 0, 0)  # frames in, out, dropped of the replaced pipelines' runs
        self._replayed = 0
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
        self._original = (self.plan, self.placement)
        # Failover may move onto any TPU of the board, not only those the plan uses.
        self._tpus = board_tpus(self.plan, self.placement)
        self._candidates: Optional[List[Plan]] = None  # the bundle's plans for the board, loaded once

    def _start(self) -> Pipeline:
        """Opens every step on its worker (opening failures are raised here)."""
        opts = self.options
        return Pipeline(self._steps(), pipelined=opts.pipelined, queue_size=opts.queue_size,
                        batch=opts.batch, tracer=self._tracer)

    def _steps(self) -> List[Step]:
        steps = [self._cnn_step(s) for s in self.plan.active_stages]
        rnn_ms = (self.plan.rnn_ms or 0.0) if self.placement.pace_cpu else 0.0
        rnn = functools.partial(_RnnStep, self.bundle, self.window, rnn_ms,
                                self._output_name, self._output_quantization,
                                compute=not (self.options.timing_only and rnn_ms > 0))
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
        spec = devices.parse_device(device)
        kind = spec.kind
        isolate = self.options.isolate
        if isolate is None:
            # An injected abort or segfault must strike a worker process, not this one.
            isolate = isolation.isolate_by_default(spec) or faults.current().crashes(device)
        isolate = bool(isolate) and kind in TPU_KINDS  # a CPU stage has no delegate to abort
        deadline = first_deadline = None
        if kind in TPU_KINDS and stage.predicted_ms is not None:
            deadline = max(self.options.deadline_floor_s, self.options.deadline_factor * stage.predicted_ms / 1e3)
            first_deadline = deadline * FIRST_INVOKE_GRACE
        # One deadline: an isolated worker is killed when the watchdog declares its invoke hung.
        opener = functools.partial(
            _CnnStage, stage, device, self._release, num_threads=threads,
            timing_only=self.options.timing_only, pace=pace, isolate=isolate,
            deadline_s=deadline, first_deadline_s=first_deadline,
        )
        return Step(f"stage {stage.index} ({stage.device})", device, opener, deadline_s=deadline,
                    first_deadline_s=first_deadline)

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
        frames = sample(src, self.window.sample_fps)
        try:
            for job in self._supervise(((None, f) for f in frames), {}, src.live, src):
                yield from job.captions
        finally:
            frames.close()
            src.close()
            self._write_trace()

    def _job(self, stream: Tuple[_Run, Optional[Hashable]], frame: Optional[Frame], pos: int) -> _FrameJob:
        # Runs on the pipeline's feeder thread: preprocess.
        t0 = time.perf_counter()
        ms = dict.fromkeys(STAGES, 0.0)
        if frame is None:  # a heartbeat
            return _FrameJob(stream, None, {}, t0, ms, pos)
        x = self._preprocess(frame.image)
        ms["preprocess"] = (time.perf_counter() - t0) * 1e3
        return _FrameJob(stream, frame, {self._input_name: x}, t0, ms, pos)

    def _supervise(self, items: Iterator[Tuple[Optional[Hashable], Optional[Frame]]],
                   windows: Mapping[Hashable, WindowSpec], live: bool,
                   src: Optional[FrameSource]) -> Iterator[_FrameJob]:
        """Runs ``items`` through the pipeline, failing over when a device fails; yields each job once.

        In file mode the source keeps the frames of every window not yet
        captioned, and a new pipeline runs them again (their jobs that came
        out before are not yielded again); in live mode the frames in flight
        and the open windows are lost and counted.
        """
        hold = not live and self.options.failover and bool(self._tpus)
        source = _Source(items, self._job, windows, self.window, hold)
        resume: Dict[Hashable, Tuple[int, int]] = {}
        first = True
        pending: Optional[float] = None  # when the latest failover began, until a frame comes out
        while True:
            run = _Run(dict(windows), resume)
            results = self._pipeline.run(source.jobs(run, resume), live=live)
            if first:
                # Not before: a run refused as busy must not replace the running one's source or stats.
                self._source, first = src, False
                self._failovers, self._carried, self._replayed = [], (0, 0, 0), 0
            switch: Optional[DeviceFailed] = None
            returned = False
            try:
                for job in results:
                    if pending is not None:
                        self._failovers[-1] = dataclasses.replace(
                            self._failovers[-1], took_s=round(time.perf_counter() - pending, 4))
                        pending = None
                    if not source.consumed(job):
                        continue
                    yield job
                    if self._returned:
                        returned = True
                        break
                else:
                    return
            except DeviceFailed as exc:
                if not self._fails_over(exc):
                    raise
                switch = exc
            finally:
                if switch is not None or returned:
                    self._pipeline.stop()  # first: the feeder then stops at once
                results.close(wait=switch is None and not returned)
            pending = time.perf_counter()
            resume = self._switch(switch, source, live)

    def _fails_over(self, exc: DeviceFailed) -> bool:
        return self.options.failover and exc.device in self.devices.values() and exc.device in self._tpus

    def _on_return(self, device: str) -> None:
        # On the prober's thread: the consumer switches after its next frame.
        with self._lock:
            self._returned.append(device)

    def _switch(self, cause: Optional[DeviceFailed], source: "_Source",
                live: bool) -> Dict[Hashable, Tuple[int, int]]:
        """Replaces the pipeline: onto the devices left after ``cause``, or onto those back again.

        Returns:
          Where each stream resumes (see ``_Run.resume``).
        """
        t0, at = time.perf_counter(), time.time()
        before = describe(self.plan, self.devices)
        old = self._pipeline
        self._release.set()  # emulated hangs of the old pipeline end
        self._retired = [p for p in self._retired if p.running()] + [old]
        s = old.stats()
        if s is not None:
            fin, fout, drop = self._carried
            self._carried = (fin + s.frames_in, fout + s.frames_out, drop + s.dropped)
        back: List[str] = []
        if cause is not None:
            device, kind, detail = cause.device, cause.kind, str(cause)
            self._failed.append(device)
            self._prober.watch(device)
        else:
            with self._lock:
                back, self._returned = self._returned, []
            device, kind = ", ".join(back), "returned"
            detail = f"{device}: returned: answers probes again"
            self._failed = [d for d in self._failed if d not in back]
        resume, lost_windows = source.resume(live)
        # Frames read that never came out, less those already counted as dropped
        # (by a replaced pipeline's live head, or lost at an earlier switch).
        lost_frames = max(0, source.in_flight() - self._carried[2]) if live else 0
        replayed = source.replay_count(resume) if not live else 0
        while True:
            choice = self._choose()
            self.plan, self.placement, self.devices = choice.plan, choice.placement, choice.placement.workers
            self._release = threading.Event()
            try:
                pipeline = self._start()
                break
            except EdgecapError as exc:
                # A device that fails as it opens is failed again: the one named,
                # else (a device just back that will not open) those that came back.
                if isinstance(exc, DeviceFailed) and exc.device in self._tpus:
                    again = [exc.device]
                elif cause is None:
                    again = [d for d in back if d in self.devices.values()]
                else:
                    again = []
                if not again:
                    raise
                for d in again:
                    self._failed.append(d)
                    self._prober.watch(d)
        with self._lock:  # close() sets _closed under it, then closes self._pipeline
            if not self._closed:
                self._pipeline = pipeline
        # Read again: a signal handler's close() may have run inside the block.
        if self._closed:
            pipeline.close()  # idempotent, if close() closed it too
            raise RunCancelled("the captioner was closed during a failover; "
                               "create a new EdgeCaptioner to caption more video")
        self._replayed += replayed
        record = FailoverRecord(device=device, kind=kind, detail=detail, at=at, took_s=None,
                                plan_before=before, plan_after=describe(self.plan, self.devices),
                                how=choice.how, replayed=replayed, lost_frames=lost_frames,
                                lost_windows=lost_windows)
        self._failovers.append(record)
        fin, fout, drop = self._carried
        self._carried = (fin, fout, drop + lost_frames)
        if self._tracer is not None:
            self._tracer.instant("failover", t0, {k: v for k, v in dataclasses.asdict(record).items()
                                                  if k not in ("at", "took_s")})
        _log.warning("edgecap: %s; now %s (%s)", detail, record.plan_after, choice.how)
        return resume

    def _choose(self) -> Replan:
        plan, placement = self._original
        if not self._failed:
            return Replan(plan, placement, "original")
        if self._candidates is None:  # at the first failure
            self._candidates = bundle_plans(self.bundle, plan)
        left = [d for d in self._tpus if d not in self._failed]
        board = self.options.board if self.options.board != "auto" else (
            self.plan_choice.board if self.plan_choice is not None else None)
        return replan(self.bundle, plan, placement, left, self._failed, board, self.options.emulate,
                      self._candidates, self.window)

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
        try:
            for job in self._supervise(iter(frames), dict(windows or {}), live, None):
                yield FrameResult(job.stream[1], job.frame, job.captions, job.device_ms)
        finally:
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
        if self._failovers:
            fin, fout, drop = self._carried
            stats = dataclasses.replace(stats, frames_in=stats.frames_in + fin,
                                        frames_out=stats.frames_out + fout, dropped=stats.dropped + drop,
                                        failovers=tuple(self._failovers), replayed=self._replayed)
        if self._source is not None:
            stats = dataclasses.replace(stats, dropped=stats.dropped + self._source.dropped)
        if any(devices.parse_device(w).kind == "tpu" for w in self.devices.values()):
            stats = dataclasses.replace(stats, thermal=tuple(devices.tpu_thermals()))
        return stats

    def close(self) -> None:
        """Stops the run in progress and joins every worker thread; idempotent."""
        with self._lock:  # a failover starting a pipeline now closes it itself (see _switch)
            self._closed = True
            pipeline = self._pipeline
        self._release.set()
        self._prober.close()
        pipeline.close()
        for old in self._retired:
            old.join()
        self._retired = []
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
        check_segments(resolved)  # load_plan checks a plan read from a file; this one was built in memory
    elif opts.plan is not None:
        resolved = load_plan(opts.plan)
    else:
        from edgecap.planning import plan_for_board  # the one door to the compiler

        resolved = plan_for_board(bundle, opts.board, window=opts.window(bundle.window))
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
