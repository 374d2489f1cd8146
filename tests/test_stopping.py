"""Stopping a pipeline from anywhere: another thread, a signal handler, garbage collection, exit."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from conftest import pipeline_threads

from edgecap.stages import Pacer
from edgecap.errors import ConfigError, PipelineBusy, RunCancelled
from edgecap.scheduler import Pipeline, Step, sleep_until

LONG_S = 30.0  # a pace no test waits out


pytestmark = pytest.mark.usefixtures("no_leaked_threads")


def _step(name, worker, fn=lambda x: x, accepts=None):
    return Step(name, worker, lambda: fn, accepts)


def _paced(x):
    # A paced emulated invoke far longer than any test.
    sleep_until(time.perf_counter() + LONG_S)
    return x


def _pacer_step():
    # The devices' own pacer, created in the worker thread as PacedSegment does.
    def open_():
        pacer = Pacer()

        def fn(x):
            pacer.wait_until(time.perf_counter() + LONG_S)
            return x

        return fn

    return open_


def _close_later(pipe, delay=0.2, **kw):
    timer = threading.Timer(delay, pipe.close, kwargs=kw)
    timer.start()
    return timer


@pytest.mark.parametrize("pipelined", [True, False])
def test_close_from_another_thread_ends_a_paced_run_within_a_second(pipelined):
    pipe = Pipeline([_step("seg", "emu-tpu:0"), _step("paced", "cpu", _paced)], pipelined=pipelined)
    timer = _close_later(pipe)
    t0 = time.perf_counter()
    with pytest.raises(RunCancelled, match="stopped by close"):
        list(pipe.run(range(100)))
    assert time.perf_counter() - t0 < 1.2  # 0.2 s before close, then at most 1 s
    timer.join()
    assert pipeline_threads() == []


def test_close_wakes_the_devices_pacer():
    pipe = Pipeline([Step("seg", "emu-tpu:0", _pacer_step()), _step("tail", "cpu")])
    timer = _close_later(pipe)
    t0 = time.perf_counter()
    with pytest.raises(RunCancelled):
        list(pipe.run(range(10)))
    assert time.perf_counter() - t0 < 1.2
    timer.join()


def test_close_from_another_thread_while_the_consumer_holds_an_item():
    pipe = Pipeline([_step("a", "tpu:0"), _step("b", "cpu")], batch=4)
    it = pipe.run(range(10_000))
    assert next(it) == 0
    closer = threading.Thread(target=pipe.close)
    closer.start()
    closer.join(1.0)
    assert not closer.is_alive()
    with pytest.raises(RunCancelled):  # not the 3 items left of its batch
        next(it)
    assert pipeline_threads() == []


@pytest.mark.parametrize("stage", ["paced", "fast"])
def test_close_from_a_signal_handler_ends_the_run(stage):
    # The consumer is the main thread: blocked on a paced stage, or busy with fast items.
    fn = _paced if stage == "paced" else (lambda x: x)
    pipe = Pipeline([_step("seg", "emu-tpu:0", fn), _step("tail", "cpu")])
    old = signal.signal(signal.SIGALRM, lambda signum, frame: pipe.close())
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        t0 = time.perf_counter()
        n = 0
        with pytest.raises(RunCancelled):
            for _ in pipe.run(iter(int, 1)):  # endless
                n += 1
        elapsed = time.perf_counter() - t0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert elapsed < 1.2
    assert (n == 0) == (stage == "paced")
    assert pipeline_threads() == []


def test_cancel_stops_the_run_and_keeps_the_workers_for_the_next():
    pipe = Pipeline([_step("seg", "emu-tpu:0", _paced), _step("tail", "cpu")])
    timer = threading.Timer(0.2, pipe.cancel)
    timer.start()
    with pytest.raises(RunCancelled, match=r"stopped by cancel\(\)"):
        list(pipe.run(range(5)))
    timer.join()
    assert len(pipeline_threads()) == 2
    pipe.close()


def test_a_second_run_from_another_thread_raises_and_the_first_goes_on():
    gate = threading.Event()

    def held(x):
        gate.wait(5.0)
        return x

    with Pipeline([_step("a", "tpu:0", held), _step("b", "cpu")]) as pipe:
        out = []
        consumer = threading.Thread(target=lambda: out.extend(pipe.run(range(20))))
        consumer.start()
        time.sleep(0.1)
        with pytest.raises(PipelineBusy, match="another thread's run is in progress"):
            pipe.run(range(3))
        gate.set()
        consumer.join(5.0)
        assert out == list(range(20))
        assert list(pipe.run(range(3))) == [0, 1, 2]  # free once the first ended


def test_a_new_run_from_the_consuming_thread_stops_the_open_one_loudly():
    with Pipeline([_step("a", "tpu:0"), _step("b", "cpu")]) as pipe:
        first = pipe.run(range(100))
        assert next(first) == 0
        assert list(pipe.run(range(3))) == [0, 1, 2]
        with pytest.raises(RunCancelled, match="a newer run"):
            next(first)


def test_a_worker_stuck_past_the_join_timeout_is_named_in_a_warning():
    release = threading.Event()

    def stuck(x):
        release.wait(10.0)  # deaf to stops, like a hung driver call
        return x

    pipe = Pipeline([_step("a", "tpu:3", stuck), _step("b", "cpu")])
    it = pipe.run(range(5))
    consumer = threading.Thread(target=lambda: pytest.raises(RunCancelled, list, it))
    consumer.start()
    time.sleep(0.1)
    t0 = time.perf_counter()
    with pytest.warns(RuntimeWarning, match=r"edgecap-tpu:3 did not stop within 0.2 s"):
        pipe.close(timeout=0.2)
    assert time.perf_counter() - t0 < 0.6
    assert [t.name for t in pipeline_threads()] == ["edgecap-tpu:3"]
    release.set()
    consumer.join(2.0)
    for t in pipeline_threads():
        t.join(2.0)


def test_a_pipeline_dropped_without_close_stops_its_threads():
    pipe = Pipeline([_step("a", "tpu:0", _paced), _step("b", "cpu")])
    it = pipe.run(range(10))
    del it, pipe
    gc.collect()
    deadline = time.monotonic() + 1.0
    while pipeline_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pipeline_threads() == []


def test_open_pipelines_are_closed_at_exit_with_a_warning_for_a_stuck_worker():
    script = textwrap.dedent(
        """
        import threading, time
        from edgecap.scheduler import Pipeline, Step, sleep_until

        def paced(x):
            sleep_until(time.perf_counter() + 60)
            return x

        def stuck(x):
            threading.Event().wait(60)
            return x

        ok = Pipeline([Step("a", "tpu:0", lambda: paced), Step("b", "cpu", lambda: (lambda x: x))])
        it1 = ok.run(range(10))
        hung = Pipeline([Step("c", "tpu:9", lambda: stuck)])
        it2 = hung.run(range(10))
        time.sleep(0.2)
        print("exiting", flush=True)
        """
    )
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, PYTHONWARNINGS="default"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "exiting\n"
    assert "edgecap-tpu:9 did not stop" in done.stderr
    assert "edgecap-tpu:0" not in done.stderr
    assert time.perf_counter() - t0 < 10.0


def test_errors_come_after_the_items_before_them_even_from_the_first_worker():
    def boom(x):
        if x == 7:
            raise ValueError("bad frame 7")
        return x

    def slow(x):
        time.sleep(0.002)
        return x

    with Pipeline([_step("a", "tpu:0", boom), _step("b", "cpu", slow)], batch=3) as pipe:
        got = []
        with pytest.raises(ValueError, match="bad frame 7"):
            for x in pipe.run(range(100)):
                got.append(x)
        assert got == list(range(7))
        assert pipe.stats().stages[0].invokes == 7  # the feeder stopped; nothing after 7 ran


@pytest.mark.parametrize("kw, match", [
    (dict(queue_size=0), "queue_size 0: each queue must hold"),
    (dict(batch=0), "batch 0: hand over at least 1 frame"),
])
def test_bad_options_are_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        Pipeline([_step("a", "cpu")], **kw)
    with pytest.raises(ConfigError, match="at least one step"):
        Pipeline([])


def _endless_frames():
    import numpy as np

    image = np.random.default_rng(0).integers(0, 255, (72, 88, 3), dtype=np.uint8)
    while True:
        yield image


def test_a_captioner_is_stopped_from_another_thread_and_refuses_a_second_stream(shipped_bundle):
    from edgecap.captioner import EdgeCaptioner

    cap = EdgeCaptioner(shipped_bundle, num_threads=1)
    started, outcome = threading.Event(), []

    def consume():
        try:
            for _ in cap.stream(_endless_frames(), fps=0):
                started.set()
        except RunCancelled as exc:
            outcome.append(exc)

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert started.wait(10.0)
    with pytest.raises(PipelineBusy):
        next(cap.stream(_endless_frames(), fps=0))
    assert cap.stats().frames_in > 0
    t0 = time.perf_counter()
    cap.close()
    consumer.join(2.0)
    assert not consumer.is_alive() and len(outcome) == 1
    assert time.perf_counter() - t0 < 1.0
    assert pipeline_threads() == []


def test_a_captioner_dropped_without_close_leaves_no_thread(shipped_bundle):
    from edgecap.captioner import EdgeCaptioner

    cap = EdgeCaptioner(shipped_bundle, num_threads=1)
    it = cap.stream(_endless_frames(), fps=0)
    next(it)
    assert pipeline_threads() != []
    del it, cap
    gc.collect()
    deadline = time.monotonic() + 1.0
    while pipeline_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pipeline_threads() == []


@pytest.mark.parametrize("batch", [1, 4])
def test_items_read_before_a_source_error_come_out_before_it(batch):
    def source():
        yield from range(5)
        raise RuntimeError("camera unplugged")

    with Pipeline([Step("id", "cpu", lambda: (lambda x: x))], batch=batch) as p:
        got = []
        with pytest.raises(RuntimeError, match="camera unplugged"):
            for x in p.run(source()):
                got.append(x)
    assert got == [0, 1, 2, 3, 4]
