"""Runs per-frame work as a pipeline: one thread per device, bounded queues between them.

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
item and counts the ones it displaced as drops.

``Pipeline(steps, pipelined=False)`` runs every step in the calling thread
instead, one item at a time: the sequential schedule, with the same statistics.

A hand-off (a queue put, and the wake-up of the thread waiting on it) costs
tens of microseconds of CPU. Where stages take well under a millisecond (a
small CNN on a fast host CPU) that is a large share of the work, so
``batch=N`` hands a file source's items over N at a time; each item still
runs every step on its own and comes out in order.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterable, Iterator, List, Optional, Sequence, Tuple

from edgecap.stats import PipelineStats, RunRecorder
from edgecap.trace import Tracer

SOURCE_TRACK = "source"
_THREAD_PREFIX = "edgecap-"


@dataclass(frozen=True)
class Step:
    """One piece of per-item work, bound to a worker.

    Attributes:
      name: The step's name in statistics and traces.
      worker: The worker (device) whose thread runs it.
      open: Called once in that thread; returns the function ``payload -> payload``
        the thread then calls for every item. It owns whatever it opens.
    """

    name: str
    worker: str
    open: Callable[[], Callable[[Any], Any]]


@dataclass
class _Item:
    seq: int
    payload: Any
    t_in: float


@dataclass
class _Job:
    recorder: RunRecorder
    items: List[_Item]


@dataclass
class _EndOfRun:
    recorder: RunRecorder


_SHUTDOWN = object()


class _HeadQueue(queue.Queue):
    """The pipeline's input queue: bounded for files, newest-only for live sources."""

    def put_latest(self, item: Any) -> int:
        """Replaces whatever is waiting with ``item``; never blocks.

        Returns:
          How many waiting items were displaced (dropped).
        """
        with self.mutex:
            dropped = len(self.queue)
            self.queue.clear()
            self.queue.append(item)
            self.not_empty.notify()
        return dropped


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
      Exception: Whatever a step's ``open`` raised, after every thread is joined.
    """

    def __init__(
        self,
        steps: Sequence[Step],
        *,
        pipelined: bool = True,
        queue_size: int = 2,
        batch: int = 1,
        tracer: Optional[Tracer] = None,
    ) -> None:
        if not steps:
            raise ValueError("a pipeline needs at least one step")
        if queue_size < 1:
            raise ValueError("queue_size must be >= 1")
        if batch < 1:
            raise ValueError("batch must be >= 1")
        self._batch = batch
        self._steps = list(steps)
        self._pipelined = pipelined
        self._tracer = tracer
        self._groups = _group_by_worker(self._steps)
        ends = [SOURCE_TRACK] + [name for name, _ in self._groups] + ["consumer"]
        self._queue_names = [f"{a}->{b}" for a, b in zip(ends, ends[1:])]
        self._queue_size = queue_size
        self._recorder: Optional[RunRecorder] = None
        self._active: Optional[Generator[Any, None, None]] = None
        self._closed = False
        self._inline: Optional[List[Callable[[Any], Any]]] = None
        self._threads: List[threading.Thread] = []
        if tracer is not None:
            tracer.add_tracks([SOURCE_TRACK] + [name for name, _ in self._groups])
        if pipelined:
            self._start_workers()
        else:
            # Opened now, so a device that cannot open fails here, as with workers.
            self._inline = [step.open() for step in self._steps]

    @property
    def workers(self) -> List[str]:
        """The worker (device) names, in pipeline order."""
        return [name for name, _ in self._groups]

    def _start_workers(self) -> None:
        self._queues: List[queue.Queue] = [_HeadQueue(self._queue_size)] + [
            queue.Queue(self._queue_size) for _ in self._groups
        ]
        ready: List[Future] = []
        for i, (name, steps) in enumerate(self._groups):
            future: Future = Future()
            thread = threading.Thread(
                target=self._work,
                args=(name, steps, self._queues[i], self._queues[i + 1], self._queue_names[i + 1], future),
                name=f"{_THREAD_PREFIX}{name}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
            ready.append(future)
        for future in ready:
            if future.exception() is not None:
                self.close()
                raise future.exception()

    def _work(
        self,
        name: str,
        steps: List[Step],
        inbox: queue.Queue,
        outbox: queue.Queue,
        outbox_name: str,
        ready: Future,
    ) -> None:
        # The worker owns its steps' resources: opened here, dropped here.
        try:
            fns = [step.open() for step in steps]
        except BaseException as exc:  # reported to the constructor, which shuts down
            ready.set_exception(exc)
            fns = []
        else:
            ready.set_result(None)
        tracer = self._tracer
        while True:
            job = inbox.get()
            if job is _SHUTDOWN:
                outbox.put(job)
                break
            if isinstance(job, _Job):
                recorder = job.recorder
                if recorder.cancelled.is_set():
                    continue
                try:
                    for item in job.items:
                        for step, fn in zip(steps, fns):
                            start = time.perf_counter()
                            item.payload = fn(item.payload)
                            end = time.perf_counter()
                            recorder.step(step.name, start, end)
                            if tracer is not None:
                                tracer.slice(name, step.name, item.seq, start, end)
                except BaseException as exc:  # a dead worker would leave the consumer waiting forever
                    recorder.fail(exc)
                    continue
                recorder.depth(outbox_name, outbox.qsize())
            outbox.put(job)
        del fns

    def run(self, items: Iterable[Any], *, live: bool = False) -> Iterator[Any]:
        """Starts a run of every item through the steps.

        A run still open is stopped first: one run at a time. Stopping the
        iteration early (``break``, the iterator's ``close()``) cancels the run:
        items in flight are dropped and the source is closed; the workers stay
        up for the next run until ``close()``.

        Args:
          items: The source. Iterated on the feeder thread (and closed there).
          live: Keep only the newest waiting item and count the others as
            drops, instead of blocking the source.

        Returns:
          An iterator of each item's payload after the last step, in input
          order. It raises the first error raised by the source or a step.

        Raises:
          RuntimeError: If the pipeline is closed.
        """
        if self._closed:
            raise RuntimeError("pipeline is closed")
        self._stop_active()
        recorder = RunRecorder(
            steps=[(s.name, w) for w, group in self._groups for s in group],
            queues=[(n, 1 if (i == 0 and live) else self._queue_size) for i, n in enumerate(self._queue_names)],
        )
        self._recorder = recorder
        if self._pipelined:
            self._active = self._run_threaded(items, recorder, live)
        else:
            self._active = self._run_inline(items, recorder)
        return self._active

    def _stop_active(self) -> None:
        if self._active is not None:
            self._active.close()
            self._active = None

    def _run_threaded(
        self, items: Iterable[Any], recorder: RunRecorder, live: bool
    ) -> Generator[Any, None, None]:
        feeder = threading.Thread(
            target=self._feed, args=(items, recorder, live), name=f"{_THREAD_PREFIX}feeder", daemon=True
        )
        feeder.start()
        outbox = self._queues[-1]
        ended = False
        try:
            while True:
                job = outbox.get()
                if isinstance(job, _EndOfRun):
                    ended = True
                    break
                for item in job.items:
                    recorder.item_out(item.t_in, time.perf_counter())
                    yield item.payload
        finally:
            if not ended:
                # The consumer stopped early (or raised): cancel, then drain so
                # every worker blocked on a full queue can reach the end marker.
                recorder.cancelled.set()
                while not isinstance(outbox.get(), _EndOfRun):
                    pass
            feeder.join()
            recorder.finish()
        if recorder.error is not None:
            raise recorder.error

    def _feed(self, items: Iterable[Any], recorder: RunRecorder, live: bool) -> None:
        head = self._queues[0]
        try:
            source = iter(items)
            try:
                self._feed_from(source, head, recorder, live)
            finally:
                close = getattr(source, "close", None)
                if close is not None:
                    close()
        except BaseException as exc:  # reported to the consumer, like a step's
            recorder.fail(exc)
        finally:
            # Always sent, so the consumer and the close() drain never wait forever.
            head.put(_EndOfRun(recorder))

    def _feed_from(self, source: Iterator[Any], head: _HeadQueue, recorder: RunRecorder, live: bool) -> None:
        batch: List[_Item] = []
        for seq, payload, t_in in self._pull(source, recorder):
            if live:
                recorder.dropped += head.put_latest(_Job(recorder, [_Item(seq, payload, t_in)]))
                continue
            batch.append(_Item(seq, payload, t_in))
            if len(batch) == self._batch:
                recorder.depth(self._queue_names[0], head.qsize())
                head.put(_Job(recorder, batch))
                batch = []
        if batch:
            head.put(_Job(recorder, batch))

    def _pull(self, source: Iterator[Any], recorder: RunRecorder) -> Iterator[Tuple[int, Any, float]]:
        """Yields (sequence number, item, arrival time) from the source, tracing each read.

        Checks for cancellation before each read, so a stopped run reads no
        further frame.
        """
        for seq in itertools.count():
            if recorder.cancelled.is_set():
                return
            start = time.perf_counter()
            try:
                payload = next(source)
            except StopIteration:
                return
            t_in = time.perf_counter()
            if self._tracer is not None:
                self._tracer.slice(SOURCE_TRACK, "source", seq, start, t_in)
            recorder.item_in(t_in)
            yield seq, payload, t_in

    def _run_inline(self, items: Iterable[Any], recorder: RunRecorder) -> Generator[Any, None, None]:
        # The sequential schedule: the calling thread owns the resources.
        tracer = self._tracer
        source = iter(items)
        try:
            for seq, payload, t_in in self._pull(source, recorder):
                for step, fn in zip(self._steps, self._inline):
                    start = time.perf_counter()
                    payload = fn(payload)
                    end = time.perf_counter()
                    recorder.step(step.name, start, end)
                    if tracer is not None:
                        tracer.slice(step.worker, step.name, seq, start, end)
                recorder.item_out(t_in, time.perf_counter())
                yield payload
        finally:
            recorder.finish()
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def stats(self) -> Optional[PipelineStats]:
        """Statistics of the current or most recent run, or None before the first."""
        return None if self._recorder is None else self._recorder.snapshot()

    def close(self) -> None:
        """Stops the workers and joins every thread; idempotent.

        A run still open is stopped first; call it from the consumer's thread.
        """
        if self._closed:
            return
        self._stop_active()
        self._closed = True
        self._inline = None
        if self._threads:
            self._queues[0].put(_SHUTDOWN)
            while self._queues[-1].get() is not _SHUTDOWN:
                pass
            for thread in self._threads:
                thread.join()
            self._threads = []

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _group_by_worker(steps: Sequence[Step]) -> List[Tuple[str, List[Step]]]:
    groups: List[Tuple[str, List[Step]]] = []
    for step in steps:
        if groups and groups[-1][0] == step.worker:
            groups[-1][1].append(step)
        else:
            groups.append((step.worker, [step]))
    names = [name for name, _ in groups]
    if len(set(names)) != len(names):
        raise ValueError(
            f"workers {names} revisit a worker; a worker's steps must be consecutive "
            "(a worker feeding itself through the chain could deadlock)"
        )
    return groups
