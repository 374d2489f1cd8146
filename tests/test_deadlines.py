"""Deadlines and hang detection: the pipeline's watchdog, sleep_until, and an isolated stage's worker.

The scheduler's tests run on a fake clock: the pipeline module reads a clock
the test holds still and moves on, so "fires at the deadline, not before,
not twice as late" is checked without waiting on the host's timing. The
isolated stage's tests run a real worker process (that is what they test);
they check which deadline was applied by the limit the error names, and that
a worker that cannot answer is killed at once, not after the stop timeout.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
import types
from typing import Any, Dict, List

import numpy as np
import psutil
import pytest

from edgecap import faults, isolation, scheduler
from edgecap.bundle import load_bundle
from edgecap.devices import parse_device
from edgecap.errors import DeviceFailed, RunCancelled
from edgecap.plans.compiler import plan_for_board
from edgecap.scheduler import Pipeline, Step, sleep_until
from edgecap.sources import open_source

pytestmark = pytest.mark.fast


class FakeClock:
    """A ``time.perf_counter`` that stands still until the test moves it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def set(self, now: float) -> None:
        with self._lock:
            self.now = now


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    """Gives the scheduler module a fake ``time.perf_counter`` (the rest of ``time`` is real)."""
    fake = FakeClock()
    monkeypatch.setattr(scheduler, "time", types.SimpleNamespace(
        perf_counter=fake, monotonic=time.monotonic, sleep=time.sleep, time=time.time))
    return fake


def _consume(pipe: Pipeline, items, out: List[Any], errors: List[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            for x in pipe.run(items):
                out.append(x)
        except BaseException as exc:  # recorded for the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _held_until(clock: FakeClock, now: float, errors: List[BaseException], real_s: float) -> bool:
    """Holds the fake clock at ``now`` for up to ``real_s`` real seconds; whether the run failed meanwhile."""
    clock.set(now)
    deadline = time.monotonic() + real_s
    while time.monotonic() < deadline:
        if errors:
            return True
        time.sleep(0.01)
    return bool(errors)


@pytest.mark.usefixtures("no_leaked_threads")
@pytest.mark.parametrize("first_deadline_s", [None, 0.5])
def test_the_watchdog_fires_at_the_deadline_not_before_and_not_later(clock, first_deadline_s):
    limit = 0.05  # fake seconds; the watchdog looks again within this many real ones
    release = threading.Event()
    entered = threading.Event()

    def stuck(x):
        if x == 1:  # the second invoke: the first took the first-invoke deadline
            entered.set()
            release.wait(30)
        return x

    pipe = Pipeline([Step("seg", "emu-tpu:0", lambda: stuck, deadline_s=limit,
                          first_deadline_s=first_deadline_s)])
    out: List[Any] = []
    errors: List[BaseException] = []
    consumer = _consume(pipe, range(3), out, errors)
    try:
        assert entered.wait(10)
        start = clock()
        # Just short of the deadline: nothing fires, however long the host takes.
        assert not _held_until(clock, start + 0.9 * limit, errors, real_s=0.3), errors
        # Past it, but short of twice it: fires.
        assert _held_until(clock, start + 1.5 * limit, errors, real_s=10.0), "the watchdog never fired"
        consumer.join(10)
        (error,) = errors
        assert isinstance(error, DeviceFailed) and error.kind == "hung"
        assert f"seg did not return within {limit:.3g} s (item 1)" in str(error)
        assert out == [0]
    finally:
        release.set()
        pipe.stop()
        pipe.join()
        consumer.join(10)


@pytest.mark.usefixtures("no_leaked_threads")
def test_the_first_invoke_gets_its_longer_deadline_on_the_watchdog(clock):
    limit, first = 0.05, 0.5
    release = threading.Event()
    entered = threading.Event()

    def stuck(x):
        entered.set()
        release.wait(30)
        return x

    pipe = Pipeline([Step("seg", "emu-tpu:0", lambda: stuck, deadline_s=limit, first_deadline_s=first)])
    out: List[Any] = []
    errors: List[BaseException] = []
    consumer = _consume(pipe, range(2), out, errors)
    try:
        assert entered.wait(10)
        start = clock()
        assert not _held_until(clock, start + 2 * limit, errors, real_s=0.3), errors
        assert _held_until(clock, start + 1.1 * first, errors, real_s=10.0), "the watchdog never fired"
        consumer.join(10)
        assert f"within {first:.3g} s (item 0)" in str(errors[0])
    finally:
        release.set()
        pipe.stop()
        pipe.join()
        consumer.join(10)


def test_sleep_until_outside_a_run_is_a_plain_sleep_that_answers_true():
    assert sleep_until(0.0) is True  # a past deadline returns at once
    t0 = time.perf_counter()
    assert sleep_until(t0 + 0.01) is True
    assert time.perf_counter() >= t0 + 0.01


@pytest.mark.usefixtures("no_leaked_threads")
@pytest.mark.parametrize("pipelined", [True, False])
def test_sleep_until_answers_whether_the_run_goes_on(pipelined):
    answers: Dict[int, bool] = {}
    holder: Dict[str, Pipeline] = {}

    def pace(x):
        if x == 2:
            holder["pipe"].cancel()  # stopped from its own step: the pace ends at once
            t0 = time.perf_counter()
            answers[x] = sleep_until(t0 + 60.0)
            answers[-1] = time.perf_counter() - t0 < 10.0
        else:
            answers[x] = sleep_until(time.perf_counter() + 0.001)
        return x

    pipe = holder["pipe"] = Pipeline([Step("pace", "emu-tpu:0", lambda: pace)], pipelined=pipelined)
    try:
        with pytest.raises(RunCancelled):
            for _ in pipe.run(range(5)):
                pass
    finally:
        pipe.close()
    assert answers == {0: True, 1: True, 2: False, -1: True}


# ---------------------------------------------------------------- an isolated stage's worker


@pytest.fixture(scope="module")
def stage(shipped_bundle):
    """The demo bundle's TPU stage on devboard-usb."""
    return plan_for_board(load_bundle(shipped_bundle), "devboard-usb").active_stages[0]


def _isolated(stage, **deadlines) -> isolation.IsolatedSegment:
    """The stage on emu-tpu:0 in a worker process (as the planner opens an isolated stage)."""
    return isolation.IsolatedSegment(stage, parse_device("emu-tpu:0"), **deadlines)


def _frame(stage, seed: int = 0) -> dict:
    spec = stage.inputs[0]
    return {spec.name: np.random.default_rng(seed).integers(-128, 128, spec.shape, dtype=spec.dtype)}


@pytest.mark.skipif(not isolation.SUPPORTED, reason="process isolation is POSIX only")
def test_only_the_first_isolated_invoke_gets_the_grace(stage):
    seg = _isolated(stage, deadline_s=0.3, first_deadline_s=4.0)
    try:
        seg(_frame(stage))  # the first invoke, within its grace
        t0 = time.perf_counter()
        with pytest.raises(DeviceFailed, match=r"emu-tpu:0: hung: no answer within 0.3 s; worker process killed"):
            seg(_frame(stage), fault=faults.Fault("emu-tpu:0", "hang", 1))
        assert time.perf_counter() - t0 < 3.5  # the second invoke's deadline, not the first's
    finally:
        seg.close()


@pytest.mark.skipif(not isolation.SUPPORTED, reason="process isolation is POSIX only")
def test_a_worker_that_cannot_answer_is_killed_at_its_deadline(stage, monkeypatch):
    # Stopped, the worker cannot act on its lifeline either: only a kill ends it. Closing
    # the segment would kill it too, after STOP_TIMEOUT_S: made long, that is unmistakable.
    monkeypatch.setattr(isolation, "STOP_TIMEOUT_S", 30.0)
    seg = _isolated(stage, deadline_s=0.3)
    pid = seg.pid
    try:
        seg(_frame(stage))
        os.kill(pid, signal.SIGSTOP)
        t0 = time.perf_counter()
        with pytest.raises(DeviceFailed, match=r"hung: no answer within 0.3 s; worker process killed"):
            seg(_frame(stage))
        took = time.perf_counter() - t0
        assert took < 10.0, f"the hung worker was not killed at its deadline ({took:.1f} s)"
        assert not psutil.pid_exists(pid)
    finally:
        if psutil.pid_exists(pid):
            os.kill(pid, signal.SIGKILL)
        seg.close()


# ---------------------------------------------------------------- the first invoke's deadline


def _tpu_stage(stage, on_chip: int, predicted_ms=1.4):
    return dataclasses.replace(stage, predicted_ms=predicted_ms,
                               param_bytes=dataclasses.replace(stage.param_bytes, on_chip=on_chip))


def test_the_first_invoke_gets_its_predicted_load_time_not_a_flat_grace(stage):
    from edgecap.failover import load_recovery
    from edgecap.options import FIRST_INVOKE_GRACE, CaptionerOptions
    from edgecap.planner import deadlines

    policy = load_recovery().first_invoke
    options = CaptionerOptions()
    tpu = parse_device("emu-tpu:0")
    six_mib = 6 * 2**20
    deadline, first = deadlines(_tpu_stage(stage, six_mib), tpu, options)
    assert deadline == options.deadline_floor_s
    # Six MiB at the slowest link, with its margin, on top of the invoke's own deadline.
    assert first == pytest.approx(deadline + policy.load_margin * six_mib / policy.load_bytes_per_s)
    # A few bytes still get the least allowance; a plan that records none is charged the whole SRAM.
    assert deadlines(_tpu_stage(stage, 1000), tpu, options)[1] == pytest.approx(deadline + policy.min_load_s)
    unknown = deadlines(_tpu_stage(stage, 0), tpu, options)[1]
    assert unknown == pytest.approx(deadline + policy.load_margin * policy.unknown_on_chip_bytes
                                    / policy.load_bytes_per_s)
    # Each is well under the flat grace it replaces (FIRST_INVOKE_GRACE times the deadline: 5 s).
    assert max(first, unknown) < deadline * FIRST_INVOKE_GRACE / 3
    # No prediction, no load to base it on: the grace stays.
    assert deadlines(_tpu_stage(stage, six_mib, None), tpu, options)[1] == pytest.approx(
        max(options.deadline_floor_s, 2.0) * FIRST_INVOKE_GRACE)


@pytest.mark.usefixtures("no_leaked_threads")
def test_a_hang_at_the_first_invoke_is_detected_within_the_policys_first_deadline(shipped_bundle):
    from edgecap.captioner import EdgeCaptioner

    images = [f.image for f in open_source(str(shipped_bundle.parent / "sample.mp4"))]
    faults.inject("emu-tpu:0=hang@0")  # the very first invoke of the new pipeline never returns
    try:
        with EdgeCaptioner(shipped_bundle, board="devboard-usb", num_threads=1) as cap:
            run = next(r for r in cap.choice.stages if str(r.worker) == "emu-tpu:0")
            t0 = time.time()
            assert len(cap.caption_frames(images)) > 0
            (record,) = [r for r in cap.stats().failovers if r.kind == "hung"]
    finally:
        faults.inject("")
    noticed = record.at - t0
    # Not before the first invoke's deadline; within it and a loaded host's slack (2 s), where
    # the flat grace this replaces (ten times the deadline) took 5 s.
    assert run.first_deadline_s <= noticed < run.first_deadline_s + 2.0, (noticed, run.first_deadline_s)
    assert run.first_deadline_s + 2.0 < 10 * run.deadline_s
