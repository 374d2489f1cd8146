"""Failure recovery beside the frame path: a device fails, the run goes on.

A ``Supervisor`` runs a captioner's frames through its pipeline and, when an
EdgeTPU fails mid-stream (``DeviceFailed``), asks the planner for what runs
next (``planner.choose_after``), starts that pipeline and resumes every
stream where its captions stopped: in file mode the frames of each window not
yet captioned are run again (nothing is lost); in live mode the frames in
flight and the windows open then are lost and counted. A ``Prober`` re-probes
each failed device (``edgecap.failover``), waiting longer after each failure
of a device that keeps failing; when one answers again the supervisor
switches back after the next frame. An ``Adapter`` (``edgecap.adapt``) measures
each device and, when the board runs off the model, proposes the plan best
for the board as measured; the supervisor switches to it the same way.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import dataclasses
import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Deque, Dict, Generator, Hashable, Iterator, List, Mapping, Optional, Tuple

from edgecap import adapt, planner
from edgecap.bundle import Bundle, WindowSpec
from edgecap.devices import DeviceSpec
from edgecap.errors import DeviceFailed, EdgecapError, RunCancelled
from edgecap.failover import Prober
from edgecap.options import CaptionerOptions
from edgecap.planner import Choice
from edgecap.plans.bundled import BundlePlans, bundle_plans
from edgecap.plans.pricing import Correction
from edgecap.scheduler import Pipeline
from edgecap.sources import Frame, FrameSource
from edgecap.stats import FailoverRecord, PipelineStats
from edgecap.trace import Tracer

_log = logging.getLogger("edgecap")

Items = Iterator[Tuple[Optional[Hashable], Optional[Frame]]]


@functools.lru_cache(maxsize=None)
def _malloc_trim() -> Optional[Callable[[int], int]]:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def _release_freed_memory() -> None:
    """Returns the C heap's free pages to the system, after a switch of pipelines.

    Each new pipeline starts new worker threads, and glibc gives threads
    malloc arenas of their own that keep what the old threads freed: without
    this the soak's resident memory grew +5.4 % over 18 switches in 10,000
    frames, +0.5 % with ``MALLOC_ARENA_MAX=2`` (results/soak.md). A switch is
    rare and this takes milliseconds, once the new pipeline runs.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@dataclass(frozen=True, eq=False)
class Run:
    """One pipeline run of a ``stream()`` or ``run_frames()`` call (compared by identity).

    Attributes:
      windows: The window spec of each stream (key).
      resume: Per stream, after a failover: the sample number its first
        frame in this run has, and the first window to open (the earlier
        ones were captioned, or are lost in live mode).
    """

    windows: Mapping[Hashable, WindowSpec]
    resume: Mapping[Hashable, Tuple[int, int]] = field(default_factory=dict)


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



@dataclass(frozen=True)
class _Stop:
    """Why a pipeline run stops before its frames end: devices came back (no ``measured``), or a better plan was measured."""

    measured: Optional[adapt.Proposal] = None


@dataclass(frozen=True)
class _Change:
    """What a switch of pipelines answers, for its record and its log line.

    Attributes:
      device: The devices concerned, in words.
      kind: ``measured``, ``returned``, or the failure's kind.
      detail: One line saying what happened.
      reprobe: For a failure, when its device is probed again.
      back: The devices that came back.
    """

    device: str
    kind: str
    detail: str
    reprobe: str = ""
    back: Tuple[DeviceSpec, ...] = ()


class _Source:
    """The input of one ``stream()`` or ``run_frames()`` call, read once, held for replays.

    Each pipeline run's feeder reads it through ``jobs``; the consumer reports
    every job that came out (``consumed``). With ``hold`` (file mode) it keeps,
    per stream, the jobs from the first frame of its earliest window not yet
    captioned on, so that after a failover a new pipeline runs them again.
    """

    def __init__(self, items: Iterator[Tuple[Optional[Hashable], Optional[Frame]]],
                 make_job: Callable[..., Any], windows: Mapping[Hashable, WindowSpec],
                 default: WindowSpec, hold: bool) -> None:
        self._items = items
        self._make_job = make_job
        self._windows, self._default = windows, default
        self._hold = hold
        # Reads are serialised: a replaced pipeline's feeder may still be in one.
        self._read_lock = threading.Lock()
        self._lock = threading.Lock()  # the held jobs: the feeder adds, the consumer trims
        self._held: Dict[Optional[Hashable], Deque[Tuple[int, Any]]] = {}
        self._counts: Dict[Optional[Hashable], int] = {}  # frames read, per stream
        self._pos = 0
        self._read = 0
        self._generation = 0  # of the newest jobs(): a replaced run's feeder stops reading
        self._ended = False
        self.consumed_frames: Dict[Optional[Hashable], int] = {}
        self.next_out = 0

    def jobs(self, run: Run, resume: Mapping[Hashable, Tuple[int, int]]) -> Iterator[Any]:
        """The jobs of one pipeline run: the held ones from each stream's resume point, then new ones.

        From this call on, the generator of an earlier run reads no more: a
        replaced pipeline's feeder could otherwise take a frame the new run
        never sees.
        """
        with self._read_lock:  # waits out a read of the replaced pipeline's feeder
            self._generation += 1
            generation = self._generation
        return self._jobs(run, resume, generation)

    def _jobs(self, run: Run, resume: Mapping[Hashable, Tuple[int, int]],
              generation: int) -> Iterator[Any]:
        with self._read_lock:
            with self._lock:
                again = sorted((job for key, held in self._held.items() for k, job in held
                                if k >= resume.get(key, (0, 0))[0]), key=lambda job: job.pos)
        for job in again:
            yield dataclasses.replace(job, stream=(run, job.stream[1]), tensors=dict(job.tensors),
                                      ms=dict(job.ms), finished=[], captions=[], device_ms={},
                                      board_ms={})
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

    def consumed(self, job: Any) -> bool:
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
        """Each stream's resume point (``Run.resume``) and the windows lost, for a new pipeline."""
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


class Supervisor:
    """Runs a captioner's frames through its pipeline, re-planning when a device fails or returns.

    Owns the running ``Choice`` and its pipeline, the failed devices, the
    prober that watches them, and the pipelines replaced (joined on close).

    Args:
      bundle: The loaded bundle.
      options: The captioner's options.
      start: The planner's choice at start.
      open_pipeline: ``(choice, released) -> Pipeline``: opens every step of a
        choice (``released`` ends its emulated hangs when it is replaced).
      tracer: Where failovers are marked, or None.

    Raises:
      EdgecapError: If the start's pipeline cannot be opened.
    """

    def __init__(self, bundle: Bundle, options: CaptionerOptions, start: Choice,
                 open_pipeline: Callable[[Choice, threading.Event], Pipeline],
                 tracer: Optional[Tracer] = None) -> None:
        self._bundle, self._options = bundle, options
        self._window = options.window(bundle.window)
        self._start, self.choice = start, start
        self._open = open_pipeline
        self._tracer = tracer
        self._release = threading.Event()  # ends the current pipeline's emulated hangs
        # Failover may move onto any TPU of the board, not only those the plan uses.
        self._tpus = planner.board_tpus(start)
        self._by_name = {str(d): d for d in self._tpus}
        self._candidates: Optional[BundlePlans] = None  # loaded at the first failure
        self._measured: Optional[BundlePlans] = None  # loaded at the first re-plan from measurements
        self._failed: List[DeviceSpec] = []
        self._workers = _board_workers(start, self._tpus)
        self._adapter = self._make_adapter(start)
        if self._adapter is not None and self._adapter.corrections:
            # What the board learned before: start on the plan best under it.
            found = self._rechoose(start, self._adapter.corrections)
            if found is not None:
                start = dataclasses.replace(found[0], reason=f"learned corrections: {found[1]}")
                self._start = self.choice = start
                _log.info("edgecap: %s", start.reason)
        self.pipeline = open_pipeline(start, self._release)
        if self._adapter is not None:
            self._adapter.started(start)
        self._returned: List[DeviceSpec] = []
        # Reentrant: close() may run in a signal handler that interrupted this thread holding it.
        self._lock = threading.RLock()
        self._closed = False
        self._prober = Prober(self._on_return)
        self._retired: List[Pipeline] = []
        self._source: Optional[FrameSource] = None
        self._failovers: List[FailoverRecord] = []
        self._carried = (0, 0, 0)  # frames in, out, dropped of the replaced pipelines' runs
        self._replayed = 0

    def run(self, items: Items, windows: Mapping[Hashable, WindowSpec], live: bool,
            src: Optional[FrameSource], make_job: Callable[..., Any]) -> Iterator[Any]:
        """Runs ``items`` through the pipeline, failing over when a device fails; yields each job once.

        In file mode the source keeps the frames of every window not yet
        captioned, and a new pipeline runs them again (their jobs that came
        out before are not yielded again); in live mode the frames in flight
        and the open windows are lost and counted.

        Args:
          items: ``(key, frame)`` pairs (a None frame is a heartbeat).
          windows: The window spec per key (default: the captioner's).
          live: A live source: keep the newest frame, lose what is in flight at a failure.
          src: The frame source whose drops ``stats`` counts, or None.
          make_job: ``(stream, frame, pos) -> job``, run on the feeder thread.
        """
        hold = not live and self._options.failover and bool(self._tpus)
        source = _Source(items, make_job, windows, self._window, hold)
        resume: Dict[Hashable, Tuple[int, int]] = {}
        first = True
        pending: Optional[float] = None  # when the latest failover began, until a frame comes out
        while True:
            results = self.pipeline.run(source.jobs(Run(dict(windows), resume), resume), live=live)
            if first:
                # Not before: a run refused as busy must not replace the running one's source or stats.
                self._source, first = src, False
                self._failovers, self._carried, self._replayed = [], (0, 0, 0), 0
            switch: Optional[DeviceFailed] = None
            stop: Optional[_Stop] = None
            try:
                stop = yield from self._frames(results, source, pending)
                if stop is None:
                    return
            except DeviceFailed as exc:
                if not self._fails_over(exc):
                    raise
                switch = exc
            finally:
                replaced = switch is not None or stop is not None
                if replaced:
                    self.pipeline.stop()  # first: the feeder then stops at once
                results.close(wait=not replaced)
            pending = time.perf_counter()
            resume = self._switch(switch, source, live, stop.measured if stop is not None else None)

    def _frames(self, results: Iterator[Any], source: "_Source",
                pending: Optional[float]) -> Generator[Any, None, Optional["_Stop"]]:
        """Yields one pipeline run's jobs, each once; returns why the run must stop early, or None at its end.

        Args:
          results: The pipeline's jobs as they come out.
          source: The call's source (counts what came out).
          pending: When the failover that started this run began, or None.
        """
        adapter = self._adapter
        for job in results:
            if pending is not None:
                self._failovers[-1] = dataclasses.replace(
                    self._failovers[-1], took_s=round(time.perf_counter() - pending, 4))
                pending = None
                _release_freed_memory()  # once the new pipeline runs: not in the failover's time
            if not source.consumed(job):
                continue
            if adapter is not None and job.frame is not None:
                adapter.observe(job.board_ms)
            yield job
            if self._returned:
                return _Stop()
            measured = self._proposed(adapter)
            if measured is not None:
                return _Stop(measured)
        return None

    def _proposed(self, adapter: Optional[adapt.Adapter]) -> Optional[adapt.Proposal]:
        """The adapter's proposed switch, if it is still to make (once: it is taken either way)."""
        if adapter is None or adapter.proposal is None:
            return None
        measured = adapter.take()
        # Priced against this choice with every device answering, or stale.
        if measured is not None and measured.base is self.choice and not self._failed:
            return measured
        return None

    def stats(self) -> Optional[PipelineStats]:
        """The current run's statistics, with the replaced pipelines' frames and the source's drops."""
        stats = self.pipeline.stats()
        if stats is None:
            return stats
        if self._failovers:
            fin, fout, drop = self._carried
            stats = dataclasses.replace(stats, frames_in=stats.frames_in + fin,
                                        frames_out=stats.frames_out + fout, dropped=stats.dropped + drop,
                                        failovers=tuple(self._failovers), replayed=self._replayed)
        if self._source is not None:
            stats = dataclasses.replace(stats, dropped=stats.dropped + self._source.dropped)
        if self._adapter is not None:
            stats = dataclasses.replace(self._adapter.steps(stats), switches=sum(
                1 for f in self._failovers if f.kind == "measured"))
        return stats

    def close(self) -> None:
        """Stops the run in progress, the prober and every pipeline; idempotent, signal-safe."""
        with self._lock:  # a failover starting a pipeline now closes it itself (see _switch)
            self._closed = True
            pipeline = self.pipeline
        self._release.set()
        self._prober.close()
        if self._adapter is not None:
            self._adapter.close()
        pipeline.close()
        for old in self._retired:
            old.join()
        self._retired = []

    def _fails_over(self, exc: DeviceFailed) -> bool:
        device = self._by_name.get(exc.device)
        return (self._options.failover and device is not None
                and device in self.choice.workers.values())

    def _on_return(self, device: DeviceSpec) -> None:
        # On the prober's thread: the consumer switches after its next frame.
        with self._lock:
            self._returned.append(device)

    def _switch(self, cause: Optional[DeviceFailed], source: "_Source", live: bool,
                measured: Optional[adapt.Proposal] = None) -> Dict[Hashable, Tuple[int, int]]:
        """Replaces the pipeline: onto the devices left after ``cause``, onto those back
        again, or onto the plan ``measured`` proposes.

        Returns:
          Where each stream resumes (see ``Run.resume``).
        """
        t0, at = time.perf_counter(), time.time()
        before = self.choice.describe()
        self._retire()
        change = self._change(cause, measured)
        resume, lost_windows = source.resume(live)
        # Frames read that never came out, less those already counted as dropped
        # (by a replaced pipeline's live head, or lost at an earlier switch).
        lost_frames = max(0, source.in_flight() - self._carried[2]) if live else 0
        replayed = source.replay_count(resume) if not live else 0
        choice = self._adopt(*self._open_next(cause, measured, change.back))
        self._replayed += replayed
        record = FailoverRecord(device=change.device, kind=change.kind, detail=change.detail, at=at,
                                took_s=None, plan_before=before, plan_after=choice.describe(),
                                how=choice.how, replayed=replayed, lost_frames=lost_frames,
                                lost_windows=lost_windows)
        self._failovers.append(record)
        fin, fout, drop = self._carried
        self._carried = (fin, fout, drop + lost_frames)
        if self._tracer is not None:
            self._tracer.instant("failover", t0, {k: v for k, v in dataclasses.asdict(record).items()
                                                  if k not in ("at", "took_s")})
        _log.warning("edgecap: %s; now %s (%s)%s", change.detail, record.plan_after, choice.how, change.reprobe)
        return resume

    def _retire(self) -> None:
        """Stops the running pipeline's emulated hangs and counts its frames; it is joined on close."""
        old = self.pipeline
        self._release.set()  # emulated hangs of the old pipeline end
        self._retired = [p for p in self._retired if p.running()] + [old]
        s = old.stats()
        if s is not None:
            fin, fout, drop = self._carried
            self._carried = (fin + s.frames_in, fout + s.frames_out, drop + s.dropped)

    def _change(self, cause: Optional[DeviceFailed], measured: Optional[adapt.Proposal]) -> "_Change":
        """What changed, for the record: a plan measured better, a device failed (now watched), or devices back."""
        if measured is not None:
            return _Change(", ".join(measured.devices), "measured", measured.reason)
        if cause is not None:
            failed = self._by_name[cause.device]
            self._failed.append(failed)
            wait = self._prober.watch(failed)
            strikes = self._prober.strikes(failed)
            reprobe = f"; probing {cause.device} again in {wait:g} s" + (
                f" (failure {strikes} in a row: damped)" if strikes > 1 else "")
            return _Change(cause.device, cause.kind, str(cause), reprobe=reprobe)
        with self._lock:
            back, self._returned = self._returned, []
        self._failed = [d for d in self._failed if d not in back]
        device = ", ".join(map(str, back))
        return _Change(device, "returned", f"{device}: returned: answers probes again", back=tuple(back))

    def _open_next(self, cause: Optional[DeviceFailed], measured: Optional[adapt.Proposal],
                   back: Tuple[DeviceSpec, ...]) -> Tuple[Choice, Pipeline]:
        """Opens the next pipeline: the measured plan's, else the failover's; a device that fails as it opens fails again.

        Raises:
          EdgecapError: If a pipeline will not open for another reason.
        """
        while True:
            choice = measured.choice if measured is not None else self._choose()
            measured = None  # if it will not open, the failover's choice comes next
            self._release = threading.Event()
            try:
                return choice, self._open(choice, self._release)
            except EdgecapError as exc:
                # A device that fails as it opens is failed again: the one named,
                # else (a device just back that will not open) those that came back.
                if isinstance(exc, DeviceFailed) and exc.device in self._by_name:
                    again = [self._by_name[exc.device]]
                elif cause is None:
                    again = [d for d in back if d in choice.workers.values()]
                else:
                    again = []
                if not again:
                    raise
                for d in again:
                    self._failed.append(d)
                    self._prober.watch(d)

    def _adopt(self, choice: Choice, pipeline: Pipeline) -> Choice:
        """Makes ``choice`` and its opened pipeline the running ones, unless the captioner was closed meanwhile.

        Raises:
          RunCancelled: If ``close()`` ran during the switch (the new pipeline is closed).
        """
        self.choice = choice
        if self._adapter is not None:
            self._adapter.started(choice, switching=not self._failed)
        with self._lock:  # close() sets _closed under it, then closes self.pipeline
            if not self._closed:
                self.pipeline = pipeline
        # Read again: a signal handler's close() may have run inside the block.
        if self._closed:
            pipeline.close()  # idempotent, if close() closed it too
            raise RunCancelled("the captioner was closed during a failover; "
                               "create a new EdgeCaptioner to caption more video")
        return choice

    def _make_adapter(self, start: Choice) -> Optional[adapt.Adapter]:
        """The start's adapter: measuring always, switching where measured times are the board's."""
        if not start.plan.board:
            return None
        emulated = any(w.kind == "emu-tpu" for w in start.workers.values())
        real = any(w.kind == "tpu" for w in start.workers.values())
        switching = self._options.adapt if self._options.adapt is not None else real or emulated
        store = self._options.corrections
        path = Path(store) if store is not None else (adapt.corrections_path() if real else None)
        corrections = adapt.load_corrections(path, start.plan.board) if path is not None and switching else {}
        if real:  # what it learned wins over what the installed libedgetpu's clock says
            corrections = {**_clock_prior(start), **corrections}
        return adapt.Adapter(start.plan.board, corrections, self._rechoose, switching,
                             path if switching else None)

    def _rechoose(self, current: Choice, corrections: Dict[str, Correction]
                  ) -> Optional[Tuple[Choice, str]]:
        """The planner's best plan under the corrections, if better than ``current`` by the margin."""
        if self._failed:  # the failover's to decide until every device answers
            return None
        if self._measured is None:
            self._measured = planner.measured_plans(self._bundle, self._window, current.plan.board)
        margin = adapt.load_policy().margin
        return planner.choose_measured(self._bundle, self._options, current, corrections,
                                       self._measured, self._workers, margin)

    def _choose(self) -> Choice:
        if self._failed and self._candidates is None:  # at the first failure
            board = self._start.plan.board
            self._candidates = (bundle_plans(self._bundle, self._window, board) if board
                                else BundlePlans())
        return planner.choose_after(self._bundle, self._options, self._start, self._failed, self._tpus,
                                    self._candidates or BundlePlans())


def _clock_prior(start: Choice) -> Dict[str, adapt.Correction]:
    """The start plan's USB TPUs at the clock libedgetpu gives them (``libedgetpu1-std``: 250 MHz, half
    the profiles' 500): a correction of their compute and invoke time, before anything is measured.

    A replicated stage's copies count too: a correction is keyed by device, and the
    pricing applies a device's correction to its copy as to a stage."""
    from edgecap import edgetpu_runtime

    speed = edgetpu_runtime.usb_speed(edgetpu_runtime.usb_clock())
    if speed == 1.0:
        return {}
    return {c.device: adapt.Correction(speed=speed) for s in start.plan.active_stages for c in s.copies
            if c.spec.kind == "tpu" and c.cost is not None and (c.cost.link or "").startswith("usb")}


def _board_workers(start: Choice, tpus: List[DeviceSpec]) -> Dict[DeviceSpec, DeviceSpec]:
    """Each EdgeTPU of the start plan's board (plan device, ``pci:0``) -> the worker that is it.

    The start's TPU stages keep their workers; the board's other TPUs (empty
    stages of the plan) take the board's other workers in stage order, so a
    device keeps its worker, and an emulated device its truth, across switches.
    """
    workers = {run.stage.spec: run.worker for run in start.stages if run.stage.spec.kind == "tpu"}
    free = [t for t in tpus if t not in workers.values()]
    for stage in start.plan.stages:
        if stage.spec.kind == "tpu" and stage.spec not in workers and free:
            workers[stage.spec] = free.pop(0)
    return workers
