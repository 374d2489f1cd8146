"""Runs per-item work as a pipeline: one thread per device, bounded queues between them.

A pipeline is a chain of ``Step``s. Consecutive steps on the same worker (a
device, e.g. ``tpu:0``, or a CPU role such as ``cpu`` and ``decode``) run on
that worker's one thread, which opens and owns their resources (interpreters),
so no interpreter is ever touched by two threads. Items flow through bounded
FIFO queues, so results come out in input order, a slow stage back-pressures
the source, and memory stays bounded whatever the consumer does.

::

    feeder ─► [head] ─► worker 0 ─► [q] ─► worker 1 ─► … ─► [out] ─► consumer (run())

The feeder thread reads the source. A file source blocks when the head queue is
full; a live source (a camera) never blocks: the head keeps only the newest
item and counts the ones it displaced as drops. Steps on the worker ``FEEDER``
(they must come first) run on the feeder thread, on each item as it is read,
before its hand-off: work that belongs with reading (a frame's resize and
quantisation), so that it overlaps the workers' without a hand-off of its own
(the sequential schedule runs them inline, as every other step).

``Pipeline(steps, pipelined=False)`` runs every step in the calling thread
instead, one item at a time: the sequential schedule, with the same statistics.

Hand-offs. A hand-off (a put, and the wake-up of the thread waiting on it)
costs microseconds of CPU. Where stages take well under a millisecond (a small
CNN on a fast host CPU) that is a large share of the work, so ``batch=N``
hands a file source's items over N at a time; each item still runs every step
on its own and comes out in order. A read that keeps the feeder waiting (a
paced source) hands over what is pending at once, so batching adds no latency
where reading, not the hand-off, is what takes the time. A step that has work for few items (a
decoder that runs once per window) says which with ``Step.accepts``: an item
it does not accept skips the step, and skips its worker altogether (no
hand-off) when no step there accepts it and that worker holds no earlier
item, which keeps results in input order.

Stopping, from any thread. One run is open at a time; a second ``run()``
from another thread while one is open raises ``PipelineBusy`` (from the
thread consuming the open run, it stops that run first).

* Breaking out of the loop and closing (or dropping) the run's iterator stops
  the run: items in flight are dropped, the feeder closes the source, and the
  workers stay up for the next run.
* ``cancel()`` stops the current run and ``close()`` stops it and the workers;
  both are safe from any thread and from a signal handler (a SIGINT or SIGTERM
  handler may call ``close()``). The run's iterator then raises
  ``RunCancelled`` at its next item (the consumer's own ``close()`` of it
  raises nothing). Blocked queue operations wake at once, and so do steps
  that wait with ``sleep_until`` (the emulated devices' pacing): a run stops
  within the time of one step invoke.
* ``close(timeout=)`` joins the threads for at most ``timeout`` seconds in
  all (``JOIN_TIMEOUT_S`` by default) and warns (``RuntimeWarning``) naming
  each thread that did not stop, e.g. a step stuck in a driver call; such a
  daemon thread is left behind.
* A pipeline dropped without ``close()`` stops its workers when it is
  garbage-collected, and every pipeline still open at interpreter exit is
  closed then, with the same timeout and warning.

A step that sleeps (pacing) should call ``sleep_until(deadline)`` instead of
``time.sleep``: it returns early, with False, when the run it works for is
stopped. No wait is longer than ``_MAX_WAIT_S`` at a time (a longer one is
made of several), so no deadline a plan can hold overflows a timed wait.

Deadlines. A step with ``deadline_s`` (an EdgeTPU's invoke) is watched: a
watchdog thread waits until the earliest deadline of an invoke in progress
and, when one passes, fails the run with ``DeviceFailed(worker, "hung",
...)``, which its iterator raises. The stuck thread cannot be interrupted:
the caller replaces the pipeline (``stop()`` now, ``join()`` later, when the
thread may have returned) instead of reusing it.

An error raised by a step or the source reaches the consumer after the
results of every item before it; the source then stops. ``PipelineBusy``
and ``RunCancelled`` are ``edgecap.errors`` classes, so a caller wrapping a
pipeline (the captioner) passes them on as they are, and a CLI's SIGINT or
SIGTERM handler needs only call ``close()`` (or ``cancel()``) and catch
``RunCancelled`` around its loop; slow work, such as writing a trace, belongs
after the loop, not in the handler.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import math
import threading
import time
import warnings
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from edgecap.errors import ConfigError, DeviceFailed, PipelineBusy, RunCancelled
from edgecap.stats import PipelineStats, RunRecorder
from edgecap.trace import Tracer

SOURCE_TRACK = "source"
# The worker of steps the feeder thread runs as it reads (see the module docstring).
FEEDER = "feeder"
_THREAD_PREFIX = "edgecap-"

JOIN_TIMEOUT_S = 1.0
# A signal handler runs on the main thread between two bytecodes, so it can
# set a stop flag after the main thread checked it and before it waits: a
# consumer on the main thread re-checks this often instead of waiting blind.
_MAIN_THREAD_RECHECK_S = 0.1
# Waits shorter than this use time.sleep, which wakes closer to the deadline
# than a condition variable does (measured: 10-20 us later at 2 ms).
_TIGHT_WAIT_S = 0.001

# Longest single timed wait. A wait past threading.TIMEOUT_MAX (~292 years)
# raises OverflowError, and a plan or option may ask for any time: longer
# waits are made of waits of this length.
_MAX_WAIT_S = 3600.0
# A read of the source that takes longer than this hands over the batch pending at once
# (a batch is for sources that are read faster than their items are worked on).
_BATCH_WAIT_S = 0.002

_local = threading.local()


@dataclass(frozen=True)
class Step:
    """One piece of per-item work, bound to a worker.

    Attributes:
      name: The step's name in statistics and traces.
      worker: The worker (device) whose thread runs it. ``FEEDER``: the
        feeder thread of each run, as it reads; such steps come first, are
        opened once in the pipeline's constructor, must own nothing bound to
        a thread, and have no deadline.
      open: Called once in that thread; returns the function ``payload -> payload``
        the thread then calls for every item. It owns whatever it opens.
      accepts: Optional ``payload -> bool``: False skips the step for that
        item, and skips the step's worker (no hand-off) when no step there
        accepts the item and that worker holds no earlier item. Called on the
        thread handing the item over and again on the step's worker, so keep
        it cheap and let it read only what earlier steps wrote. The first
        worker receives every item.
      deadline_s: Seconds an invoke may take; past it the pipeline's
        watchdog fails the run with ``DeviceFailed(worker, "hung", ...)``
        (the thread stays blocked: the caller replaces the pipeline). None: no
        deadline.
      first_deadline_s: The deadline of the step's first invoke (a delegate
        loads its parameters then); default ``deadline_s``.
    """

    name: str
    worker: str
    open: Callable[[], Callable[[Any], Any]]
    accepts: Optional[Callable[[Any], bool]] = None
    deadline_s: Optional[float] = None
    first_deadline_s: Optional[float] = None
    weight: float = 1.0


@dataclass(frozen=True)
class Replicas:
    """One step run as copies on several workers: items dealt by weight, put back in order after them.

    Each copy is a ``Step`` on a worker of its own; its ``weight`` is its
    share of the items. The dealer is a deterministic smooth weighted
    round-robin (each run deals the same way from its first item), and a
    reorder buffer after the copies hands items on in input order, so what
    follows sees exactly what one worker would have given it.

    Attributes:
      copies: The copies, at least two, on distinct workers; none may have ``accepts``.
    """

    copies: Tuple[Step, ...]


class _Flag:
    """A settable flag one may wait on; settable from a signal handler.

    Unlike ``threading.Event`` it is built on a reentrant lock: a signal
    handler that interrupts the main thread while it holds the lock can still
    set it instead of deadlocking.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._set = False

    def set(self) -> None:
        with self._cond:
            self._set = True
            self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        """Waits until the flag is set or ``timeout`` seconds pass; returns the flag."""
        with self._cond:
            if not self._set:
                self._cond.wait(min(timeout, _MAX_WAIT_S))
            return self._set


class _Run:
    """One run's shared state: its recorder, how far it goes, who consumes it."""

    _numbers = itertools.count()

    def __init__(self, recorder: RunRecorder) -> None:
        self.number = next(_Run._numbers)  # later runs have larger numbers
        self.recorder = recorder
        # Items after this sequence number are dropped: inf while the run goes
        # on, the failing item's after an error, -1 once cancelled.
        self.stop_after: float = math.inf
        self.stopped = _Flag()
        self._lock = threading.RLock()
        self.owner = threading.get_ident()
        self.ended = False
        self.reason = ""
        self.error: Optional[BaseException] = None
        self.feeder: Optional[threading.Thread] = None

    @property
    def cancelled(self) -> bool:
        return self.stop_after < 0

    @property
    def open(self) -> bool:
        return not self.ended and not self.cancelled

    def halt(self, seq: int) -> None:
        """An item failed: items after ``seq`` need no more work."""
        with self._lock:
            self.stop_after = min(self.stop_after, seq)

    def cancel(self, reason: str, error: Optional[BaseException] = None) -> bool:
        """Drops every item in flight; returns False if the run had ended already.

        Args:
          reason: For the ``RunCancelled`` message.
          error: Raise this to the consumer instead of ``RunCancelled``.
        """
        with self._lock:
            if not self.open:
                return False
            self.stop_after = -1
            self.reason = reason
            self.error = error
        self.recorder.finish()
        self.stopped.set()
        return True


class _Item:
    __slots__ = ("seq", "payload", "t_in")

    def __init__(self, seq: int, payload: Any, t_in: float) -> None:
        self.seq, self.payload, self.t_in = seq, payload, t_in


class _Job:
    """What one hand-off carries: items of one run, or the run's end (with its error, if any)."""

    __slots__ = ("run", "seq", "items", "end", "error", "dealt")

    def __init__(self, run: _Run, seq: int, items: List[_Item], end: bool = False,
                 error: Optional[BaseException] = None) -> None:
        self.run, self.seq, self.items, self.end, self.error = run, seq, items, end, error
        self.dealt = 0  # its place in the run's deal to the copies of a replicated step


class _OpenStep:
    """A step as its worker runs it: opened, with the deadline its next invoke is held to."""

    __slots__ = ("index", "name", "fn", "accepts", "deadline_s", "limit")

    def __init__(self, index: int, step: "Step", fn: Callable[[Any], Any]) -> None:
        self.index, self.name, self.fn, self.accepts = index, step.name, fn, step.accepts
        self.deadline_s = step.deadline_s
        # The first invoke's deadline gives way to the step's own after one invoke.
        self.limit = step.first_deadline_s if step.first_deadline_s is not None else step.deadline_s


class _Invoke:
    """The watched invoke in progress on a worker: when it is due, and what to name if it hangs."""

    __slots__ = ("due", "name", "seq", "run", "limit")

    def __init__(self, due: float, name: str, seq: int, run: "_Run", limit: float) -> None:
        self.due, self.name, self.seq, self.run, self.limit = due, name, seq, run, limit


class _Closed(Exception):
    """The pipeline is closed: the thread waiting on a queue exits."""


class _Dropped(Exception):
    """The job's run stopped while its put waited for room."""


class _Channel:
    """A bounded FIFO between threads whose waits a stop interrupts.

    It records the depth it had at each put into the putting job's run, under
    its own lock, so a queue that several threads put into (see
    ``Step.accepts``) still has one writer per counter.
    """

    def __init__(self, index: int, capacity: int) -> None:
        self.index = index
        self.capacity = capacity
        self.puts = 0
        self.closed = False
        self._items: Deque[_Job] = collections.deque()
        # Reentrant: close() may run in a signal handler that interrupted the
        # main thread (the consumer) inside one of these methods.
        lock = threading.RLock()
        self._lock = lock
        self._not_empty = threading.Condition(lock)
        self._not_full = threading.Condition(lock)

    def put(self, job: _Job) -> None:
        """Appends ``job``, waiting for room.

        Raises:
          _Closed: The pipeline closed.
          _Dropped: The job's run stopped while waiting.
        """
        with self._lock:
            items = self._items
            while len(items) >= self.capacity and not self.closed:
                if job.seq > job.run.stop_after:
                    raise _Dropped
                self._not_full.wait()
            if self.closed:
                raise _Closed
            self._record(job.run.recorder, len(items))
            items.append(job)
            self.puts += 1
            self._not_empty.notify()

    def put_latest(self, job: _Job) -> int:
        """Replaces whatever waits with ``job``; never blocks. Returns how many it displaced."""
        with self._lock:
            if self.closed:
                raise _Closed
            dropped = len(self._items)
            self._record(job.run.recorder, dropped)
            self._items.clear()
            self._items.append(job)
            self.puts += 1
            self._not_empty.notify()
        return dropped

    def _record(self, recorder: RunRecorder, depth: int) -> None:
        i = self.index
        recorder.depth_sum[i] += depth
        recorder.depth_puts[i] += 1
        if depth > recorder.depth_max[i]:
            recorder.depth_max[i] = depth

    def get(self, run: Optional[_Run] = None, recheck: Optional[float] = None) -> _Job:
        """Takes the oldest job, waiting for one.

        Args:
          run: Also stop waiting when this run is cancelled (the consumer's get).
          recheck: Re-check the stop conditions this often (seconds) while waiting.

        Raises:
          _Closed: The pipeline closed, or ``run`` was cancelled.
        """
        with self._lock:
            items = self._items
            while not items:
                if self.closed or (run is not None and run.cancelled):
                    raise _Closed
                self._not_empty.wait(recheck)
            job = items.popleft()
            self._not_full.notify()
            return job

    def wake(self) -> None:
        """Wakes every waiter, to re-check whether its run stopped."""
        with self._lock:
            self._not_empty.notify_all()
            self._not_full.notify_all()

    def close(self) -> None:
        """Drops what waits and makes every wait, now and later, raise ``_Closed``."""
        with self._lock:
            self.closed = True
            self._items.clear()
            self._not_empty.notify_all()
            self._not_full.notify_all()


class _Dealer:
    """Deals jobs to the inboxes of a replicated step's copies: a smooth weighted round-robin.

    Each pick adds every copy's weight to its credit and takes the copy with
    the most (the first among equals), which then pays the total: over any
    stretch each copy gets its weight's share, evenly spread. A new run starts
    the deal afresh, so a run is dealt the same way whenever it runs. One
    thread puts at a time (the worker before, or the reorder buffer that
    feeds it).
    """

    def __init__(self, inboxes: Sequence[_Channel], weights: Sequence[float]) -> None:
        self._inboxes = list(inboxes)
        self._deal = _Deal(weights)
        self._run: Optional[_Run] = None
        self._dealt = 0

    def put(self, job: _Job) -> None:
        """Stamps ``job`` with its place in the deal and puts it into the next copy's inbox (may wait for room)."""
        if job.run is not self._run:
            self._run, self._dealt = job.run, 0
            self._deal.restart()
        job.dealt, self._dealt = self._dealt, self._dealt + 1
        self._inboxes[self._deal.next()].put(job)


class _Deal:
    """A smooth weighted round-robin: which copy takes the next item."""

    def __init__(self, weights: Sequence[float]) -> None:
        self._weights = [float(w) for w in weights]
        self._total = sum(self._weights)
        self.restart()

    def restart(self) -> None:
        self._credit = [0.0] * len(self._weights)

    def next(self) -> int:
        credit = self._credit
        for i, w in enumerate(self._weights):
            credit[i] += w
        pick = credit.index(max(credit))
        credit[pick] -= self._total
        return pick


class _Reorder:
    """Where a replicated step's copies put their jobs: handed on in the order they were dealt.

    A copy that finishes early waits here (it does not block: the jobs held
    are at most those in flight between the dealer and here); the next job in
    the deal is handed on at once, on the thread that put it, so a copy
    never waits for room behind a job that is not yet done. Jobs of a run
    older than the newest seen are stale (their run stopped) and are dropped.
    """

    def __init__(self, target: Any) -> None:
        self._target = target
        self._lock = threading.RLock()
        self._run: Optional[_Run] = None
        self._next = 0
        self._held: Dict[int, _Job] = {}

    def put(self, job: _Job) -> None:
        """Takes a copy's job; hands on every job now in order (may wait for room downstream)."""
        with self._lock:
            run = job.run
            if self._run is None or run.number > self._run.number:
                self._run, self._next, self._held = run, 0, {}
            elif run is not self._run:
                return
            self._held[job.dealt] = job
            while self._next in self._held:
                ready = self._held.pop(self._next)
                self._next += 1
                if ready.seq > run.stop_after:
                    continue  # its run stopped: no one waits for it
                try:
                    self._target.put(ready)
                except _Dropped:
                    pass


def sleep_until(deadline: float) -> bool:
    """Sleeps until ``time.perf_counter()`` reaches ``deadline``, or the current run stops.

    For steps that wait (an emulated device's pacing): called on a pipeline
    thread, it returns as soon as the run the thread works for is cancelled or
    the pipeline closed, so stopping never waits out a long pace. The last
    millisecond is slept with ``time.sleep``, which wakes closest to the
    deadline. Outside a run it is a plain sleep.

    Args:
      deadline: A ``time.perf_counter()`` value; a past one returns at once.

    Returns:
      False if the run was stopped (the deadline may not be reached), else True.
    """
    run: Optional[_Run] = getattr(_local, "run", None)
    remaining = deadline - time.perf_counter()
    while remaining > _TIGHT_WAIT_S:  # in bounded waits: see _MAX_WAIT_S
        if run is not None:
            if run.stopped.wait(remaining - _TIGHT_WAIT_S):
                return False
        else:
            time.sleep(min(remaining - _TIGHT_WAIT_S, _MAX_WAIT_S))
        remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)
    return run is None or not run.cancelled


class _Core:
    """What the pipeline's threads share; it holds no reference to the ``Pipeline``.

    So a pipeline dropped without ``close()`` can be collected, and its
    finalizer stops the threads.
    """

    def __init__(self, groups: List[Tuple[str, List[Step]]], positions: List[List[int]], queue_size: int,
                 batch: int, tracer: Optional[Tracer]) -> None:
        self.groups = groups
        # The feeder's opened steps (``FEEDER``), set by the pipeline once they are open.
        self.fed: List[_OpenStep] = []
        self.batch = batch
        self.tracer = tracer
        # channels[w]: worker w's inbox; channels[-1]: the consumer's.
        self.channels = [_Channel(i, queue_size) for i in range(len(groups) + 1)]
        self.position = [p for p, workers in enumerate(positions) for _ in workers]
        # What each position is fed through: its one worker's inbox, or a dealer to its copies'.
        entries: List[Any] = [self.channels[ws[0]] if len(ws) == 1 else
                              _Dealer([self.channels[w] for w in ws], [groups[w][1][0].weight for w in ws])
                              for ws in positions]
        self.entries = entries + [self.channels[-1]]
        # What each worker puts into: the next position's entry, or after copies their reorder buffer.
        joins = {p: _Reorder(self.entries[p + 1]) for p, ws in enumerate(positions) if len(ws) > 1}
        self.targets = [joins.get(self.position[w], self.entries[self.position[w] + 1])
                        for w in range(len(groups))]
        # Jobs each worker has finished with (forwarded or dropped), written by
        # that worker only: with its inbox's puts it tells whether it is idle.
        self.done = [0] * len(groups)
        # Per worker: the predicates an item must fail to pass it by, or None
        # when it takes every item (the first worker and the consumer do).
        self.skips: List[Optional[List[Callable[[Any], bool]]]] = [None]
        for w, (_, steps) in enumerate(groups[1:], start=1):
            preds = [s.accepts for s in steps if s.accepts is not None]
            alone = len(positions[self.position[w]]) == 1
            self.skips.append(preds if alone and len(preds) == len(steps) else None)
        self.skips.append(None)
        self.threads: List[threading.Thread] = []
        self.feeders: List[threading.Thread] = []
        self.active: Optional[_Run] = None
        self.lock = threading.RLock()
        # Per worker, written by that worker only: the invoke in progress of a
        # step with a deadline, else None.
        self.invoking: List[Optional[_Invoke]] = [None] * len(groups)
        limits = [s.deadline_s for _, steps in groups for s in steps if s.deadline_s is not None]
        # The watchdog looks again at least this often while no invoke is watched.
        self.watch_period: Optional[float] = min(limits) if limits else None
        self.closing = _Flag()

    def route(self, worker: int, job: _Job) -> int:
        """The channel a job leaving ``worker`` goes to: the next worker's, or past it.

        Only a worker alone at its position, before one alone at its, routes
        (``skips``): worker and position indices then agree.
        """
        k = worker + 1
        while True:
            preds = self.skips[k]
            # A worker still holding an earlier job is not passed by: order is kept.
            if preds is None or self.channels[k].puts != self.done[k]:
                return k
            if any(accepts(item.payload) for item in job.items for accepts in preds):
                return k
            k += 1

    def entry(self, worker: int) -> Any:
        """What feeds ``worker``'s position (``len(groups)``: the consumer's channel)."""
        return self.entries[self.position[worker]] if worker < len(self.groups) else self.channels[-1]

    def wake(self) -> None:
        for channel in self.channels:
            channel.wake()

    def shutdown(self, reason: str = "close()") -> None:
        """Stops the open run and makes every thread exit; never blocks for long."""
        run = self.active
        if run is not None:
            run.cancel(reason)
        for channel in self.channels:
            channel.close()
        self.closing.set()

    def join(self, timeout: float) -> None:
        """Joins the workers and feeders, ``timeout`` seconds in all; warns naming each that did not stop."""
        deadline = time.monotonic() + timeout
        with self.lock:
            threads = self.threads + self.feeders
        me = threading.current_thread()
        stuck = []
        for thread in threads:
            if thread is me:
                continue
            try:
                thread.join(max(0.0, deadline - time.monotonic()))
            except RuntimeError:  # a signal handler's close() during its start(): it finds the queues closed
                continue
            if thread.is_alive():
                stuck.append(thread.name)
        with self.lock:
            self.threads = [t for t in self.threads if t.is_alive()]
            self.feeders = [t for t in self.feeders if t.is_alive()]
        if stuck:
            warnings.warn(
                f"edgecap: {', '.join(stuck)} did not stop within {timeout:g} s of close() and "
                "is left running; a step is blocked (a device or a source that does not return)",
                RuntimeWarning,
                stacklevel=3,
            )


# Every core with threads, for the join at interpreter exit (threads hold their core).
_LIVE: "weakref.WeakSet[_Core]" = weakref.WeakSet()


@atexit.register
def _close_all_at_exit() -> None:
    for core in list(_LIVE):
        core.shutdown("interpreter exit")
        core.join(JOIN_TIMEOUT_S)


def _watch(core: _Core) -> None:
    """The watchdog thread: fails the run of an invoke that outlives its step's deadline.

    It waits (on the pipeline's closing flag) until the earliest deadline of
    an invoke in progress, or ``watch_period`` when none is watched, so it
    wakes a few times a second at most, never per item.
    """
    fired: List[Any] = [None] * len(core.invoking)
    period = core.watch_period or _MAX_WAIT_S
    while True:
        now = time.perf_counter()
        wake = now + period
        for w, slot in enumerate(core.invoking):
            if slot is None or slot is fired[w]:
                continue
            if now < slot.due:
                wake = min(wake, slot.due)
                continue
            fired[w] = slot
            error = DeviceFailed(core.groups[w][0], "hung",
                                 f"{slot.name} did not return within {slot.limit:.3g} s (item {slot.seq})")
            if slot.run.cancel(f"{slot.name} hung", error):
                core.wake()
        if core.closing.wait(max(wake - now, 0.0)):
            return


def _work(core: _Core, w: int, first: int, ready: Future) -> None:
    """A worker thread: opens its steps, then runs every job of its inbox through them."""
    name, steps = core.groups[w]
    fns: List[Callable[[Any], Any]] = []
    try:
        for step in steps:
            fns.append(step.open())
    except BaseException as exc:  # reported to the constructor, which shuts down
        _close_steps(fns)
        ready.set_exception(exc)
        return
    ready.set_result(None)
    try:
        _serve(core, w, first, steps, fns)
    finally:
        # The worker owns its steps: a device (an isolated stage's worker
        # process) is released as the thread ends, not when a collector runs.
        _close_steps(fns)


def _close_steps(fns: List[Callable[[Any], Any]]) -> None:
    """Closes each opened step that has a ``close()``; one that raises is reported and passed by."""
    for fn in fns:
        close = getattr(fn, "close", None)
        if close is None:
            continue
        try:
            close()
        except Exception as exc:  # the next step must close all the same
            warnings.warn(f"edgecap: closing a step failed ({type(exc).__name__}: {exc})",
                          RuntimeWarning, stacklevel=2)


def _serve(core: _Core, w: int, first: int, steps: List[Step], fns: List[Callable[[Any], Any]]) -> None:
    """Runs every job of worker ``w``'s inbox through its opened steps, until the pipeline closes."""
    name = core.groups[w][0]
    plan = [_OpenStep(first + j, step, fn) for j, (step, fn) in enumerate(zip(steps, fns))]
    inbox, channels, done, tracer = core.channels[w], core.channels, core.done, core.tracer
    target = core.targets[w]
    route = core.route if core.skips[w + 1] is not None and target is channels[w + 1] else None
    current: Optional[_Run] = None
    busy: List[float] = []
    invokes: List[int] = []
    try:
        while True:
            job = inbox.get()
            run = job.run
            if job.seq > run.stop_after:  # its run stopped
                done[w] += 1
                continue
            if job.items:
                if run is not current:
                    current = _local.run = run
                    busy, invokes = run.recorder.busy, run.recorder.invokes
                _run_items(job, plan, name, tracer, busy, invokes, core.invoking, w)
            if job.seq <= run.stop_after:
                try:
                    (target if route is None else core.entry(route(w, job))).put(job)
                except _Dropped:
                    pass
            done[w] += 1
    except _Closed:
        pass


def _run_items(job: _Job, plan: List[_OpenStep], track: str, tracer: Optional[Tracer],
               busy: List[float], invokes: List[int], invoking: List[Optional[_Invoke]], w: int) -> None:
    """Runs each item of ``job`` through a worker's steps; a failure ends the job there."""
    perf_counter = time.perf_counter
    for n, item in enumerate(job.items):
        try:
            for step in plan:
                if step.accepts is not None and not step.accepts(item.payload):
                    continue
                start = perf_counter()
                limit = step.limit
                if limit is not None:
                    invoking[w] = _Invoke(start + limit, step.name, item.seq, job.run, limit)
                    item.payload = step.fn(item.payload)
                    invoking[w] = None
                    step.limit = step.deadline_s
                else:
                    item.payload = step.fn(item.payload)
                end = perf_counter()
                busy[step.index] += end - start
                invokes[step.index] += 1
                if tracer is not None:
                    tracer.slice(track, step.name, item.seq, start, end)
        except BaseException as exc:  # a dead worker would leave the consumer waiting forever
            invoking[w] = None
            # Items before it go on; the error reaches the consumer after them.
            job.run.halt(item.seq)
            job.items, job.end, job.error = job.items[:n], True, exc
            return


def _feed(core: _Core, run: _Run, items: Iterable[Any], live: bool) -> None:
    """The feeder thread: reads the source into the head queue, then sends the run's end."""
    head = core.channels[0]
    recorder, tracer, batch, fed = run.recorder, core.tracer, core.batch, core.fed
    _local.run = run
    seq = 0
    pending: List[_Item] = []
    try:
        try:
            source = iter(items)
            try:
                # Checked before each read, so a stopped run reads no further item.
                while seq <= run.stop_after:
                    start = time.perf_counter()
                    try:
                        payload = next(source)
                    except StopIteration:
                        break
                    t_in = time.perf_counter()
                    if tracer is not None:
                        tracer.slice(SOURCE_TRACK, "source", seq, start, t_in)
                    recorder.item_in(t_in)
                    item = _Item(seq, payload, t_in)
                    if fed:
                        _run_fed(item, fed, tracer, recorder.busy, recorder.invokes)
                    seq += 1
                    if live:
                        recorder.dropped += head.put_latest(_Job(run, item.seq, [item]))
                        continue
                    pending.append(item)
                    # A source that kept this read waiting (a camera fed as a file, a
                    # paced stream) is not waited on again for a batch: what is read goes now.
                    if len(pending) == batch or t_in - start > _BATCH_WAIT_S:
                        head.put(_Job(run, pending[0].seq, pending))
                        pending = []
                if pending:
                    head.put(_Job(run, pending[0].seq, pending))
            finally:
                close = getattr(source, "close", None)
                if close is not None:
                    close()
        except (_Closed, _Dropped):
            raise
        except BaseException as exc:  # reported to the consumer, like a step's
            # Items read before the error still go through, and come out before it.
            run.halt(seq)
            head.put(_Job(run, pending[0].seq if pending else seq, pending, end=True, error=exc))
        else:
            if seq <= run.stop_after:  # else no one waits for the end
                head.put(_Job(run, seq, [], end=True))
    except (_Closed, _Dropped):
        pass


def _run_fed(item: _Item, fed: List[_OpenStep], tracer: Optional[Tracer], busy: List[float],
             invokes: List[int]) -> None:
    """Runs the feeder's steps on an item as it is read; an error is the source's (see ``_feed``)."""
    for step in fed:
        if step.accepts is not None and not step.accepts(item.payload):
            continue
        start = time.perf_counter()
        item.payload = step.fn(item.payload)
        end = time.perf_counter()
        busy[step.index] += end - start
        invokes[step.index] += 1
        if tracer is not None:
            tracer.slice(SOURCE_TRACK, step.name, item.seq, start, end)


class Pipeline:
    """A chain of steps run on worker threads, one run (source) at a time.

    Args:
      steps: The steps, in the order every item goes through them.
      pipelined: Run each worker on its own thread; False runs every step in
        the calling thread (the sequential schedule).
      queue_size: Capacity of each queue between workers, in hand-offs.
      batch: Items handed from worker to worker at once (file sources; a live
        source always hands over its newest item alone).
      tracer: Records one slice per step invoke when given.

    Raises:
      ConfigError: If there is no step, ``queue_size`` or ``batch`` is below 1,
        or a worker's steps are not consecutive.
      Exception: Whatever a step's ``open`` raised, after every thread is joined.
    """

    def __init__(
        self,
        steps: Sequence["Step | Replicas"],
        *,
        pipelined: bool = True,
        queue_size: int = 2,
        batch: int = 1,
        tracer: Optional[Tracer] = None,
    ) -> None:
        if not steps:
            raise ConfigError("a pipeline needs at least one step; give it the steps to run")
        if queue_size < 1:
            raise ConfigError(f"queue_size {queue_size}: each queue must hold at least 1 hand-off; use 1 or more")
        if batch < 1:
            raise ConfigError(f"batch {batch}: hand over at least 1 frame at a time; use 1 or more")
        steps = list(steps)
        fed = 0
        while fed < len(steps) and not isinstance(steps[fed], Replicas) and steps[fed].worker == FEEDER:
            fed += 1
        self._fed: List[Step] = steps[:fed]
        for step in self._fed:
            if step.deadline_s is not None:
                raise ConfigError(f"{step.name}: a step on the feeder has no deadline; give it a worker")
        self._groups, positions = _group_by_worker(steps[fed:])
        self._steps = self._fed + [step for _, group in self._groups for step in group]
        self._positions = positions
        self._pipelined = pipelined
        self._queue_names = _queue_names([[self._groups[w][0] for w in ws] for ws in positions])
        self._queue_size = queue_size
        self._tracer = tracer
        self._core = _Core(self._groups, positions, queue_size, batch, tracer)
        self._lock = threading.RLock()
        self._closed = False
        self._inline: Optional[List[Callable[[Any], Any]]] = None
        if tracer is not None:
            tracer.add_tracks([SOURCE_TRACK] + [name for name, _ in self._groups])
        # Bound to the core, not to self: the finalizer must not keep the pipeline alive.
        self._finalizer = weakref.finalize(self, self._core.shutdown, "garbage collection")
        self._finalizer.atexit = False  # _close_all_at_exit joins, with a timeout
        if pipelined:
            self._core.fed = [_OpenStep(i, step, step.open()) for i, step in enumerate(self._fed)]
            self._start_workers()
        else:
            # Opened now, so a device that cannot open fails here, as with workers.
            self._inline = [step.open() for step in self._steps]

    @property
    def workers(self) -> List[str]:
        """The worker (device) names, in pipeline order."""
        return [name for name, _ in self._groups]

    def _start_workers(self) -> None:
        core = self._core
        ready: List[Future] = []
        first = len(self._fed)
        for w, (name, steps) in enumerate(self._groups):
            future: Future = Future()
            thread = threading.Thread(
                target=_work, args=(core, w, first, future), name=f"{_THREAD_PREFIX}{name}", daemon=True
            )
            first += len(steps)
            thread.start()
            core.threads.append(thread)
            ready.append(future)
        if core.watch_period is not None:
            watchdog = threading.Thread(target=_watch, args=(core,), name=f"{_THREAD_PREFIX}watchdog", daemon=True)
            watchdog.start()
            core.threads.append(watchdog)
        _LIVE.add(core)
        for future in ready:
            if future.exception() is not None:
                self.close()
                raise future.exception()

    def run(self, items: Iterable[Any], *, live: bool = False) -> Iterator[Any]:
        """Starts a run of every item through the steps.

        One run at a time: started from the thread that consumes the open run,
        it stops that run first (resumed, the old iterator raises
        ``RunCancelled``); from another thread, it raises ``PipelineBusy``.
        Stopping the iteration early (``break`` and dropping the iterator, or
        its ``close()``) cancels the run: items in flight are dropped and the
        source is closed; the workers stay up for the next run.

        Args:
          items: The source. Iterated on the feeder thread (and closed there);
            in the calling thread with ``pipelined=False``.
          live: Keep only the newest waiting item and count the others as
            drops, instead of blocking the source.

        Returns:
          An iterator of each item's payload after the last step, in input
          order. It raises the first error raised by the source or a step
          (after the items before it), and ``RunCancelled`` once ``cancel()``
          or ``close()`` stopped the run.

        Raises:
          RuntimeError: If the pipeline is closed.
          PipelineBusy: If another thread's run is open.
        """
        recorder = RunRecorder(
            steps=[(s.name, FEEDER) for s in self._fed] + [(s.name, w) for w, group in self._groups for s in group],
            queues=[(n, 1 if (i == 0 and live) else self._queue_size) for i, n in enumerate(self._queue_names)],
        )
        run = _Run(recorder)
        with self._lock:
            if self._closed:
                raise RuntimeError("pipeline is closed")
            previous = self._core.active
            if previous is not None and previous.open:
                if previous.owner != run.owner:
                    raise PipelineBusy(
                        f"pipeline {'/'.join(self.workers)}: another thread's run is in progress; "
                        "stop it first (close its iterator, or cancel()) or use a pipeline per thread"
                    )
                previous.cancel("a newer run started on this pipeline")
                self._core.wake()
            self._core.active = run
        if previous is not None and previous.feeder is not None:
            # The previous run's source is closed before this one is read.
            _join(previous.feeder, JOIN_TIMEOUT_S, "its run was stopped")
        if not self._pipelined:
            return _InlineRun(self, run, items)
        run.feeder = threading.Thread(
            target=_feed, args=(self._core, run, items, live), name=f"{_THREAD_PREFIX}feeder", daemon=True
        )
        with self._core.lock:  # so close() joins it, or finds the queues closed when it starts
            self._core.feeders = [t for t in self._core.feeders if t.is_alive()] + [run.feeder]
            run.feeder.start()
        return _ThreadedRun(self, run)

    def stats(self) -> Optional[PipelineStats]:
        """Statistics of the current or most recent run, or None before the first."""
        run = self._core.active
        return None if run is None else run.recorder.snapshot()

    def cancel(self) -> None:
        """Stops the current run, if any; safe from any thread and from a signal handler.

        Its iterator raises ``RunCancelled``; the workers stay up for the next run.
        """
        run = self._core.active
        if run is not None and run.cancel("cancel()"):
            self._core.wake()

    def close(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Stops the run in progress and the workers, and joins every thread; idempotent.

        Safe from any thread and from a signal handler: the run's iterator
        raises ``RunCancelled`` at its next item.

        Args:
          timeout: Seconds to wait for the threads, in all; each thread still
            running then is named in a ``RuntimeWarning`` and left behind.
        """
        if self.stop():
            self.join(timeout)

    def stop(self) -> bool:
        """Stops the run in progress and tells every thread to exit, without waiting for them.

        For replacing a pipeline whose device failed: a thread blocked in the
        device is left to end in its own time; ``join`` (or ``close``) waits
        for the threads later. Safe from any thread and from a signal handler.

        Returns:
          False if the pipeline was stopped already.
        """
        with self._lock:
            if self._closed:
                return False
            self._closed = True
        self._finalizer.detach()
        self._core.shutdown()
        self._inline = None
        return True

    def running(self) -> List[str]:
        """The names of this pipeline's threads still running (after ``stop``: those not yet ended)."""
        with self._core.lock:
            threads = self._core.threads + self._core.feeders
        return [t.name for t in threads if t.is_alive()]

    def join(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Joins the threads of a stopped pipeline, ``timeout`` seconds in all; warns naming each still running."""
        self._core.join(timeout)

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _join(thread: threading.Thread, timeout: float, why: str) -> None:
    if thread is threading.current_thread():
        return
    thread.join(timeout)
    if thread.is_alive():
        warnings.warn(f"edgecap: {thread.name} did not stop within {timeout:g} s after {why}; "
                      "its source is blocked in a read and is left running", RuntimeWarning, stacklevel=4)


def _cancelled(run: _Run) -> BaseException:
    if run.error is not None:
        return run.error
    return RunCancelled(f"the run was stopped by {run.reason or 'close()'} before its end; "
                        "start a new run to process more")


class _ThreadedRun(Iterator[Any]):
    """The consumer's end of a pipelined run: payloads in input order."""

    def __init__(self, pipeline: Pipeline, run: _Run) -> None:
        self._pipeline = pipeline  # kept alive while the run is consumed
        self._run = run
        self._out = pipeline._core.channels[-1]
        self._pending: Deque[_Item] = collections.deque()
        self._end = False
        self._error: Optional[BaseException] = None

    def __next__(self) -> Any:
        run = self._run
        while True:
            if run.cancelled and not self._end:
                self._end = True
                self._pending.clear()
                self._finish()
                raise _cancelled(run)
            if self._pending:
                item = self._pending.popleft()
                run.recorder.item_out(item.t_in, time.perf_counter())
                return item.payload
            if self._end:
                self._finish()
                error, self._error = self._error, None
                if error is not None:
                    raise error
                raise StopIteration
            recheck = _MAIN_THREAD_RECHECK_S if threading.current_thread() is threading.main_thread() else None
            try:
                job = self._out.get(run, recheck)
            except _Closed:  # cancelled, or the pipeline closed
                run.cancel("close()")
                self._end = True
                self._finish()
                raise _cancelled(run) from None
            if job.run is not run:  # left over from a stopped run
                continue
            self._pending.extend(job.items)
            if job.end:
                self._end, self._error = True, job.error
                run.ended = True

    def _finish(self) -> None:
        run = self._run
        run.recorder.finish()
        if run.feeder is not None:
            _join(run.feeder, JOIN_TIMEOUT_S, "its run ended")

    def close(self, wait: bool = True) -> None:
        """Stops the run if it is still going: items in flight are dropped, the source closed.

        Args:
          wait: Join the feeder (at most ``JOIN_TIMEOUT_S``); False leaves a
            feeder blocked in a read to end on its own (``Pipeline.join``).
        """
        if self._run.cancel("closing its iterator"):
            self._pipeline._core.wake()
        self._end, self._error = True, None
        self._pending.clear()
        if wait:
            self._finish()
        else:
            self._run.recorder.finish()

    def __del__(self) -> None:
        try:
            if self._run.cancel("dropping its iterator"):
                self._pipeline._core.wake()
        except Exception:  # at interpreter exit, what it needs may be gone
            pass


class _InlineRun(Iterator[Any]):
    """A run of the sequential schedule: every step in the consumer's thread."""

    def __init__(self, pipeline: Pipeline, run: _Run, items: Iterable[Any]) -> None:
        self._pipeline = pipeline
        self._run = run
        self._fns: List[Callable[[Any], Any]] = pipeline._inline or []
        self._source: Optional[Iterator[Any]] = None
        self._items = items
        self._seq = 0
        self._done = False
        # Per replicated position: the steps of each copy, and the deal among them.
        copies = [[[j for j, _ in _steps_of(pipeline, w)] for w in ws]
                  for ws in pipeline._positions if len(ws) > 1]
        self._deals = [(c, _Deal([pipeline._steps[steps[0]].weight for steps in c])) for c in copies]
        self._every = set(range(len(self._fns))) - {j for c in copies for steps in c for j in steps}

    def _taken(self) -> set:
        """The steps the next item runs: every step but the copies it is not dealt to."""
        taken = set(self._every)
        for copies, deal in self._deals:
            taken.update(copies[deal.next()])
        return taken

    def __next__(self) -> Any:
        run = self._run
        if self._done:
            raise StopIteration
        if run.cancelled:
            self._finish()
            raise _cancelled(run)
        recorder, tracer = run.recorder, self._pipeline._tracer
        _local.run = run
        try:
            if self._source is None:
                self._source = iter(self._items)
            start = time.perf_counter()
            payload = next(self._source)
            t_in = time.perf_counter()
            seq, self._seq = self._seq, self._seq + 1
            if tracer is not None:
                tracer.slice(SOURCE_TRACK, "source", seq, start, t_in)
            recorder.item_in(t_in)
            taken = self._taken()
            for j, (step, fn) in enumerate(zip(self._pipeline._steps, self._fns)):
                if j not in taken or (step.accepts is not None and not step.accepts(payload)):
                    continue
                start = time.perf_counter()
                payload = fn(payload)
                end = time.perf_counter()
                recorder.busy[j] += end - start
                recorder.invokes[j] += 1
                if tracer is not None:
                    tracer.slice(step.worker, step.name, seq, start, end)
        except BaseException:
            self._finish()
            raise
        finally:
            _local.run = None
        if run.cancelled:  # stopped while a step ran (its pacing cut short)
            self._finish()
            raise _cancelled(run)
        recorder.item_out(t_in, time.perf_counter())
        return payload

    def _finish(self) -> None:
        self._done = True
        self._run.ended = True
        self._run.recorder.finish()
        source = self._items if self._source is None else self._source
        close = getattr(source, "close", None)
        if close is not None:
            close()

    def close(self, wait: bool = True) -> None:
        """Ends the run and closes the source (``wait`` is for ``_ThreadedRun``'s signature)."""
        self._run.cancel("closing its iterator")
        if not self._done:
            self._finish()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # at interpreter exit, what it needs may be gone
            pass


def _steps_of(pipeline: "Pipeline", worker: int) -> List[Tuple[int, Step]]:
    """Worker ``worker``'s steps with their indices in the pipeline's flat list."""
    first = len(pipeline._fed) + sum(len(group) for _, group in pipeline._groups[:worker])
    return list(enumerate(pipeline._groups[worker][1], start=first))


def _queue_names(positions: List[List[str]]) -> List[str]:
    """Each inbox's name (``a->b``; a copy's inbox is fed from what comes before its position), then the consumer's."""
    names, before = [], SOURCE_TRACK
    for workers in positions:
        names += [f"{before}->{w}" for w in workers]
        before = "+".join(workers)
    return names + [f"{before}->consumer"]


def _group_by_worker(steps: Sequence["Step | Replicas"]) -> Tuple[List[Tuple[str, List[Step]]], List[List[int]]]:
    """The workers, each with its steps, and the positions of the chain, each its worker(s) by index.

    Consecutive steps on one worker share it; each copy of a ``Replicas`` is
    a worker of its own, and the copies together one position.

    Raises:
      ConfigError: If a worker's steps are not consecutive, a step runs on the
        ``FEEDER`` (the feeder's steps come before these), the first step is
        replicated, or a ``Replicas`` has fewer than two copies or a copy with ``accepts``.
    """
    groups: List[Tuple[str, List[Step]]] = []
    positions: List[List[int]] = []
    for step in steps:
        if not isinstance(step, Replicas) and step.worker == FEEDER:
            raise ConfigError(f"{step.name} runs on the feeder after steps that do not; "
                              "put the feeder's steps first")
        if isinstance(step, Replicas):
            _check_replicas(step, first=not groups)
            for copy in step.copies:
                groups.append((copy.worker, [copy]))
            positions.append(list(range(len(groups) - len(step.copies), len(groups))))
        elif groups and groups[-1][0] == step.worker and len(positions[-1]) == 1:
            groups[-1][1].append(step)
        else:
            groups.append((step.worker, [step]))
            positions.append([len(groups) - 1])
    # A worker feeding itself through the chain could deadlock: its steps must be consecutive.
    first: Dict[str, str] = {}
    for name, group in groups:
        if name in first:
            raise ConfigError(
                f"puts {first[name]} and {group[0].name} on worker {name} with other steps "
                "between them; give each device a worker of its own, e.g. cpu:1"
            )
        first[name] = group[0].name
    return groups, positions


def _check_replicas(step: Replicas, first: bool) -> None:
    names = ", ".join(c.name for c in step.copies)
    if len(step.copies) < 2:
        raise ConfigError(f"replicas of {names or 'nothing'}: give at least two copies, or the step alone")
    if first:
        raise ConfigError(f"replicas of {names}: the first step takes every item as it comes (a live source "
                          "keeps the newest); put a step before the copies")
    if any(c.accepts is not None for c in step.copies):
        raise ConfigError(f"replicas of {names}: a copy takes every item dealt to it; drop its accepts")
    if any(not (c.weight > 0 and math.isfinite(c.weight)) for c in step.copies):
        raise ConfigError(f"replicas of {names}: each copy's weight must be a positive finite share")
