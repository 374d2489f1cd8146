"""The host path (issue 27): decoding beside the models in two threads, and the CNN's kernel threads re-checked."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from edgecap import cpu_load, devices, planner, stages
from edgecap.bundle import DEMO_DIR
from edgecap.captioner import EdgeCaptioner
from edgecap.preprocess import Preprocessor
from edgecap.sources import VideoFileSource, sample

pytestmark = pytest.mark.fast

SAMPLE = DEMO_DIR / "sample.mp4"


def _captions(cap, source):
    return [(c.start_frame, c.end_frame, c.tokens, c.confidence) for c in cap.stream(source)]


def test_other_load_is_the_systems_busy_time_less_this_process_over_the_wall_time():
    readings = iter([(0.0, 10.0, 1.0), (2.0, 13.0, 2.0), (4.0, 14.5, 3.4), (4.0, 15.0, 3.5)])
    load = cpu_load.OtherLoad(0.0, read=lambda: next(readings))
    assert load.poll() == pytest.approx(1.0)  # 3 s busy, 1 s of it ours, over 2 s
    assert load.poll() == pytest.approx(0.05)  # 1.5 s busy, 1.4 s ours
    assert load.poll() is None  # no time passed
    real = cpu_load.OtherLoad(3600.0)
    assert real.poll() is None  # not a period yet


def test_on_two_cores_a_small_cnn_runs_beside_the_feeder_that_decodes_and_preprocesses(monkeypatch):
    with EdgeCaptioner(DEMO_DIR / "bundle", pipelined=False, num_threads=1) as cap:
        expected = _captions(cap, SAMPLE)
    monkeypatch.setattr(devices, "cpu_cores", lambda: 2)
    where = {}
    preprocess, step = Preprocessor.__call__, stages.SegmentRunner.__call__

    def spy(name, fn):
        def wrapped(self, *args):
            where.setdefault(name, set()).add(threading.current_thread().name)
            return fn(self, *args)
        return wrapped

    monkeypatch.setattr(Preprocessor, "__call__", spy("preprocess", preprocess))
    monkeypatch.setattr(stages.SegmentRunner, "__call__", spy("cnn", step))
    with EdgeCaptioner(DEMO_DIR / "bundle") as cap:
        assert (cap.choice.host.kind, cap.choice.pipelined, cap.choice.preprocess_worker) == (
            "overlap", True, "feeder")
        assert _captions(cap, SAMPLE) == expected
        assert cap._supervisor.pipeline.workers == ["cpu", "decode"]  # no preprocess worker
    assert where == {"preprocess": {"edgecap-feeder"}, "cnn": {"edgecap-cpu"}}


def test_a_file_sampled_below_its_rate_converts_only_the_frames_it_keeps():
    converted = []

    class Counting:  # the capture, counting what it converts to BGR
        def __init__(self, cap):
            self._cap = cap

        def retrieve(self, *args):
            converted.append(1)
            return self._cap.retrieve(*args)

        def __getattr__(self, name):
            return getattr(self._cap, name)

    with VideoFileSource(SAMPLE) as src:
        every = [(f.index, f.timestamp, f.image.copy()) for f in src]
    with VideoFileSource(SAMPLE) as src:
        src._cap = Counting(src._cap)
        kept = [(f.index, f.timestamp, f.image) for f in sample(src, 8.0)]
    # What the generic clock keeps of every frame, image for image.
    clock = [f for f in sample(iter([_frame(i, t, im) for i, t, im in every]), 8.0)]
    assert [(i, t) for i, t, _ in kept] == [(f.index, f.timestamp) for f in clock] == [
        (i, t) for i, t, _ in every[::2]]
    assert all(np.array_equal(a, f.image) for (_, _, a), f in zip(kept, clock))
    assert len(converted) == len(kept) - 1  # the first frame was converted as the file opened


def _frame(index, timestamp, image):
    from edgecap.sources import Frame

    return Frame(index, timestamp, image)


class _Scripted:
    """Other processes' load as a test scripts it: one reading a poll."""

    def __init__(self, readings):
        self._readings = iter(readings)

    def poll(self):
        return next(self._readings, None)


class _Runner:
    def __init__(self, threads, opened):
        self.threads = threads
        opened.append(threads)

    def __call__(self, tensors):
        return (self.threads, tensors)

    def close(self):
        pass


@pytest.mark.parametrize("faster, expected", [(True, [(2, 1, True), (1, 2, True)]), (False, [(2, 1, False)])])
def test_a_cnn_on_every_core_tries_one_thread_while_another_process_takes_a_core_and_keeps_the_faster(
        monkeypatch, faster, expected):
    from edgecap.rethread import Rethreaded

    schedule = planner.host_schedule(200.0, 2.0, 2)
    opened = []
    # Readings: a core free, then taken (try 1), taken still, then free again (try 2 if 1 was kept).
    load = _Scripted([0.0, None, 0.9] + [None] * 7 + [1.0, 0.9] + [None] * 8 + [0.1] + [None] * 20)
    monkeypatch.setattr(planner, "keep_threads", lambda before_ms, after_ms: faster)
    stage = Rethreaded(schedule, 2, lambda threads: _Runner(threads, opened), load)
    ran = [stage(i)[0] for i in range(40)]
    assert stage.changes == expected
    assert opened == [2, 1]  # each thread count opened once, when first wanted
    first = ran.index(1)
    assert ran[first:first + planner.HOST_TRIAL_FRAMES] == [1] * planner.HOST_TRIAL_FRAMES  # the trial
    assert ran[-1] == 2  # back on both cores: kept the second trial, or went back from the first
    if not faster:  # dropped at 0.9, not tried again at 1.0 (within the margin)
        assert ran.count(1) == planner.HOST_TRIAL_FRAMES


def test_a_cnn_whose_load_proposes_nothing_still_tries_the_other_thread_count_now_and_then(monkeypatch):
    from edgecap.rethread import Rethreaded

    monkeypatch.setattr(planner, "HOST_EXPLORE_S", 0.0)
    monkeypatch.setattr(planner, "keep_threads", lambda before_ms, after_ms: False)
    opened = []
    stage = Rethreaded(planner.host_schedule(200.0, 2.0, 2), 2, lambda threads: _Runner(threads, opened),
                       _Scripted([0.0] * 40))
    for i in range(30):
        stage(i)
    # No core taken, yet one thread was tried (and dropped) at every look after a trial ended.
    assert stage.changes[:2] == [(2, 1, False), (2, 1, False)] and stage.threads == 2


def test_a_host_cnn_on_every_core_runs_its_re_checked_threads_with_the_same_captions(monkeypatch):
    with EdgeCaptioner(DEMO_DIR / "bundle", pipelined=False, num_threads=1) as cap:
        expected = _captions(cap, SAMPLE)
    monkeypatch.setattr(devices, "cpu_cores", lambda: 2)
    monkeypatch.setattr(planner, "measure_host", lambda bundle, plan, window, float_rnn: (200.0, 2.0))
    readings = [None] * 3 + [0.9] + [None] * 100
    monkeypatch.setattr(cpu_load, "OtherLoad", lambda period_s: _Scripted(readings))
    monkeypatch.setattr(planner, "keep_threads", lambda before_ms, after_ms: True)
    with EdgeCaptioner(DEMO_DIR / "bundle") as cap:
        assert cap.choice.host.kind == "threads" and cap.choice.stages[0].recheck is cap.choice.host
        assert _captions(cap, SAMPLE) == expected  # the same captions on either interpreter


def test_the_host_measurement_takes_the_fastest_of_many_so_a_busy_moment_does_not_make_a_small_cnn_big(
        shipped_bundle, monkeypatch):
    import types

    from edgecap import interpreter, rnn
    from edgecap.bundle import load_bundle

    clock = types.SimpleNamespace(now=0.0, calls=0)

    class Interrupted:  # another process takes the core for the first invokes: 5 ms, then 0.1 ms
        def invoke(self):
            clock.calls += 1
            clock.now += 0.005 if clock.calls <= 3 else 0.0001

    class Step:
        def __init__(self, *args):
            pass

        def step(self, feature, state):
            return state

    monkeypatch.setattr(planner, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    monkeypatch.setattr(interpreter, "make_cpu_interpreter", lambda model, threads: Interrupted())
    monkeypatch.setattr(rnn, "RnnEncoder", Step)
    bundle = load_bundle(shipped_bundle)
    cnn_ms, _ = planner.measure_host(bundle, planner.compiled_encoder.cpu_plan(bundle), bundle.window)
    # The fastest of two after a warm-up was 5 ms, which made the demo's CNN "threads".
    assert cnn_ms == pytest.approx(0.1)
    assert clock.calls <= planner.MEASURE_HOST_MAX + 1


def test_a_trial_is_kept_only_when_it_was_clearly_faster():
    assert planner.keep_threads(20.0, 17.0)  # 15 % faster
    assert not planner.keep_threads(20.0, 19.0)  # 5 %: within a shared host's noise, what runs stays
    assert not planner.keep_threads(20.0, 25.0)
