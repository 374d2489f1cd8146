"""The pipeline scheduler with synthetic steps: order, ownership, back-pressure, drops, shutdown."""

from __future__ import annotations

import threading
import time

import pytest

from edgecap.errors import ConfigError
from edgecap.scheduler import FEEDER, Pipeline, Step
from edgecap.trace import Tracer, load_slices


def _pipeline_threads():
    return [t for t in threading.enumerate() if t.name.startswith("edgecap-")]


def _step(name, worker, fn=lambda x: x):
    return Step(name, worker, lambda: fn)


def _sleepy(seconds, tag):
    def fn(items):
        time.sleep(seconds)
        return items + [tag]

    return fn


def _counting_source(n, alive):
    # Counts items read but not yet consumed: the consumer decrements alive["n"].
    for i in range(n):
        alive["n"] += 1
        alive["max"] = max(alive["max"], alive["n"])
        yield i


@pytest.fixture(autouse=True)
def no_leaked_threads():
    yield
    assert _pipeline_threads() == []


def test_results_come_out_in_order_through_every_step():
    steps = [
        _step("a", "tpu:0", _sleepy(0.001, "a")),
        _step("b", "tpu:1", _sleepy(0.002, "b")),
        _step("c", "cpu", _sleepy(0.0005, "c")),
        _step("d", "cpu", lambda x: x + ["d"]),
    ]
    with Pipeline(steps) as pipe:
        out = list(pipe.run([[i] for i in range(40)]))
        assert pipe.workers == ["tpu:0", "tpu:1", "cpu"]
    assert out == [[i, "a", "b", "c", "d"] for i in range(40)]


def test_sequential_schedule_gives_the_same_results_in_the_calling_thread():
    seen = set()

    def fn(x):
        seen.add(threading.get_ident())
        return x * 2

    steps = [_step("a", "tpu:0", fn), _step("b", "cpu", fn)]
    with Pipeline(steps, pipelined=False) as pipe:
        assert list(pipe.run(range(10))) == [4 * i for i in range(10)]
        assert _pipeline_threads() == []
    assert seen == {threading.get_ident()}


def test_each_step_runs_only_on_the_thread_that_opened_it():
    opened, called = {}, {}

    def opener(name):
        def open_():
            opened[name] = threading.get_ident()

            def fn(x):
                called.setdefault(name, set()).add(threading.get_ident())
                return x

            return fn

        return open_

    steps = [Step("a", "tpu:0", opener("a")), Step("b", "tpu:1", opener("b")), Step("c", "tpu:1", opener("c"))]
    with Pipeline(steps) as pipe:
        list(pipe.run(range(20)))
        list(pipe.run(range(5)))
    assert {k: {v} for k, v in opened.items()} == called
    assert opened["b"] == opened["c"] != opened["a"]


def test_stopping_early_cancels_the_run_closes_the_source_and_keeps_workers():
    closed = threading.Event()

    def source():
        try:
            for i in range(10_000):
                yield i
        finally:
            closed.set()

    steps = [_step("a", "tpu:0", _sleepy(0.001, "a")), _step("b", "cpu")]
    pipe = Pipeline(steps)
    for n, _ in enumerate(pipe.run(([i] for i in source()))):
        if n == 5:
            break
    # The run is cancelled once its iterator is dropped; the next run works.
    assert list(pipe.run([[1], [2]])) == [[1, "a"], [2, "a"]]
    assert closed.is_set()
    assert len(_pipeline_threads()) == 2
    pipe.close()
    assert _pipeline_threads() == []


def test_close_during_a_run_joins_every_thread():
    pipe = Pipeline([_step("a", "tpu:0", _sleepy(0.002, "a")), _step("b", "cpu")])
    it = pipe.run([i] for i in range(10_000))
    next(it)
    next(it)
    pipe.close()
    assert _pipeline_threads() == []
    with pytest.raises(RuntimeError):
        pipe.run([])


def test_slow_consumer_bounds_items_in_flight():
    alive = {"n": 0, "max": 0}
    source = _counting_source(200, alive)
    steps = [_step("a", "tpu:0"), _step("b", "tpu:1"), _step("c", "cpu")]
    with Pipeline(steps, queue_size=2) as pipe:
        for _ in pipe.run(source):
            alive["n"] -= 1
            time.sleep(0.001)
    # 4 queues of 2, 3 workers holding one each, the feeder holding one.
    assert alive["max"] <= 4 * 2 + 3 + 1
    assert alive["n"] == 0


def test_live_source_keeps_the_newest_item_and_counts_drops():
    steps = [_step("slow", "tpu:0", _sleepy(0.005, "s")), _step("c", "cpu")]

    def camera():
        for i in range(300):
            time.sleep(0.0005)
            yield [i]

    with Pipeline(steps) as pipe:
        out = [x[0] for x in pipe.run(camera(), live=True)]
        stats = pipe.stats()
    assert stats.dropped > 0
    assert out == sorted(out) and len(set(out)) == len(out)
    assert stats.frames_in == 300
    assert stats.frames_out == len(out) == 300 - stats.dropped
    assert out[-1] == 299  # the newest frame is never the one dropped


def test_file_source_processes_every_item_under_back_pressure():
    steps = [_step("slow", "tpu:0", _sleepy(0.002, "s"))]
    with Pipeline(steps) as pipe:
        out = list(pipe.run([i] for i in range(50)))
        stats = pipe.stats()
    assert len(out) == 50 and stats.dropped == 0
    assert stats.queues[0].max_depth >= 1  # the source ran ahead and was held back


def test_step_error_is_raised_to_the_consumer_and_the_pipeline_recovers():
    def boom(x):
        if x == 7:
            raise ValueError("bad frame 7")
        return x

    with Pipeline([_step("a", "tpu:0"), _step("b", "cpu", boom)]) as pipe:
        got = []
        with pytest.raises(ValueError, match="bad frame 7"):
            for x in pipe.run(range(100)):
                got.append(x)
        assert got == list(range(7))
        assert list(pipe.run([1, 2])) == [1, 2]


def test_source_error_is_raised_to_the_consumer():
    def source():
        yield 1
        raise OSError("camera unplugged")

    with Pipeline([_step("a", "cpu")]) as pipe:
        with pytest.raises(OSError, match="unplugged"):
            list(pipe.run(source()))


def test_open_failure_raises_and_joins_threads():
    def bad_open():
        raise FileNotFoundError("segment missing")

    with pytest.raises(FileNotFoundError):
        Pipeline([_step("a", "tpu:0"), Step("b", "cpu", bad_open), _step("c", "decode")])


def test_a_worker_may_not_be_revisited():
    # Named by its steps: a worker revisited could feed itself through the chain and deadlock.
    with pytest.raises(ConfigError, match="puts a and c on worker cpu with other steps between them"):
        Pipeline([_step("a", "cpu"), _step("b", "tpu:0"), _step("c", "cpu")])


def test_stats_measure_busy_time_and_rates():
    steps = [_step("slow", "tpu:0", _sleepy(0.004, "s")), _step("fast", "cpu", _sleepy(0.001, "f"))]
    with Pipeline(steps) as pipe:
        list(pipe.run([i] for i in range(40)))
        stats = pipe.stats()
    by_name = {s.name: s for s in stats.stages}
    assert by_name["slow"].invokes == by_name["fast"].invokes == 40
    assert by_name["slow"].mean_ms >= 4.0
    assert by_name["slow"].utilization > by_name["fast"].utilization
    assert 0.6 < by_name["slow"].utilization <= 1.0
    # Throughput is set by the slowest step (4 ms plus sleep overshoot, which a loaded host stretches).
    assert 100 < stats.fps_out <= 250
    assert stats.latency_ms["p50"] >= 5.0
    assert set(stats.worker_utilization()) == {"tpu:0", "cpu"}


def test_trace_has_one_track_per_worker_and_a_slice_per_invoke(tmp_path):
    tracer = Tracer()
    steps = [_step("seg0", "tpu:0"), _step("tail", "cpu"), _step("rnn", "cpu")]
    with Pipeline(steps, tracer=tracer) as pipe:
        list(pipe.run(range(6)))
    path = tmp_path / "trace.json"
    tracer.write(path)
    tracks = load_slices(path)
    assert set(tracks) == {"source", "tpu:0", "cpu"}
    assert [e["args"]["frame"] for e in tracks["tpu:0"]] == list(range(6))
    assert sorted(e["name"] for e in tracks["cpu"]) == ["rnn"] * 6 + ["tail"] * 6
    assert all(e["dur"] >= 0 for e in tracks["cpu"])


def test_a_source_that_is_not_iterable_or_fails_to_close_is_an_error_not_a_hang():
    class BadClose:
        def __iter__(self):
            return self

        def __next__(self):
            raise StopIteration

        def close(self):
            raise OSError("close failed")

    with Pipeline([_step("a", "cpu")]) as pipe:
        with pytest.raises(TypeError):
            list(pipe.run(42))
        with pytest.raises(OSError, match="close failed"):
            list(pipe.run(BadClose()))


class _Abort(BaseException):
    """Not an Exception: what a step may raise that ``except Exception`` misses."""


def test_a_step_raising_a_base_exception_is_raised_to_the_consumer_not_a_hang():
    def abort(x):
        if x == 3:
            raise _Abort("step aborted")
        return x

    raised = []

    def consume(pipe):
        try:
            list(pipe.run(range(10)))
        except _Abort as exc:
            raised.append(exc)

    with Pipeline([_step("a", "tpu:0"), _step("b", "cpu", abort)]) as pipe:
        consumer = threading.Thread(target=consume, args=(pipe,), daemon=True)
        consumer.start()
        consumer.join(5.0)
        assert not consumer.is_alive(), "consumer hung on a dead worker"
        assert [str(e) for e in raised] == ["step aborted"]
        assert list(pipe.run([1, 2])) == [1, 2]  # the worker survived


def test_sequential_schedule_opens_its_steps_in_the_constructor():
    opened = []

    def bad_open():
        opened.append(threading.current_thread())
        raise FileNotFoundError("segment missing")

    with pytest.raises(FileNotFoundError):
        Pipeline([_step("a", "tpu:0"), Step("b", "cpu", bad_open)], pipelined=False)
    assert opened == [threading.current_thread()]


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_batched_hand_offs_give_every_item_in_order_with_per_item_stats(batch, tmp_path):
    tracer = Tracer()
    steps = [_step("a", "tpu:0", lambda x: x + ["a"]), _step("b", "cpu", lambda x: x + ["b"])]
    with Pipeline(steps, batch=batch, tracer=tracer) as pipe:
        out = list(pipe.run([i] for i in range(10)))  # 10 is no multiple of 3 or 8
        stats = pipe.stats()
    assert out == [[i, "a", "b"] for i in range(10)]
    assert stats.frames_in == stats.frames_out == 10
    assert {s.name: s.invokes for s in stats.stages} == {"a": 10, "b": 10}
    tracer.write(tmp_path / "trace.json")
    assert [e["args"]["frame"] for e in load_slices(tmp_path / "trace.json")["tpu:0"]] == list(range(10))


def test_batched_hand_offs_bound_items_in_flight_and_stop_early():
    alive = {"n": 0, "max": 0}
    source = _counting_source(200, alive)
    steps = [_step("a", "tpu:0"), _step("b", "cpu")]
    with Pipeline(steps, queue_size=2, batch=4) as pipe:
        for i, _ in enumerate(pipe.run(source)):
            alive["n"] -= 1
            time.sleep(0.001)
        # 3 queues of 2 hand-offs, 2 workers and the consumer holding one each,
        # the feeder filling the next: all of 4 items.
        assert alive["max"] <= (3 * 2 + 3 + 1) * 4
        for i, _ in enumerate(pipe.run(range(100))):
            if i == 5:
                break
        assert list(pipe.run(range(3))) == [0, 1, 2]


def test_batch_must_be_positive():
    with pytest.raises(ConfigError, match="batch"):
        Pipeline([_step("a", "cpu")], batch=0)



def test_items_a_step_does_not_accept_pass_its_worker_by_in_order():
    # A decoder that works once per 8-frame window: most frames need no hand-off to it.
    def rnn(x):
        time.sleep(0.001)
        return x + ["rnn"]

    def decode(x):
        time.sleep(0.0015)  # frames after it would overtake it if order were not kept
        return x + ["decoded"]

    steps = [
        _step("cnn", "tpu:0", lambda x: x + ["cnn"]),
        _step("rnn", "cpu", rnn),
        Step("decode", "decode", lambda: decode, accepts=lambda x: x[0] % 8 == 7),
    ]
    stats = {}
    for pipelined in (True, False):
        with Pipeline(steps, pipelined=pipelined) as pipe:
            out = list(pipe.run([i] for i in range(80)))
            stats[pipelined] = pipe.stats()
        assert out == [[i, "cnn", "rnn"] + (["decoded"] if i % 8 == 7 else []) for i in range(80)]
        assert {s.name: s.invokes for s in stats[pipelined].stages} == {"cnn": 80, "rnn": 80, "decode": 10}
    queues = {q.name: q.puts for q in stats[True].queues}
    # Every decode-bound frame is handed to the decoder; the others only while it is busy.
    assert 10 <= queues["cpu->decode"] < 60
    assert queues["cpu->decode"] + queues["decode->consumer"] >= 80 + 1  # every frame and the end


def test_a_worker_with_a_step_that_takes_every_item_is_never_passed_by():
    seen = []
    steps = [
        _step("a", "tpu:0"),
        Step("b", "cpu", lambda: (lambda x: x * 10), accepts=lambda x: x % 2 == 0),
        Step("c", "cpu", lambda: (lambda x: seen.append(x) or x)),
    ]
    with Pipeline(steps) as pipe:
        assert list(pipe.run(range(6))) == [0, 1, 20, 3, 40, 5]
        assert [q.puts for q in pipe.stats().queues] == [7, 7, 7]
    assert seen == [0, 1, 20, 3, 40, 5]


@pytest.mark.parametrize("batch", [1, 4])
def test_steps_on_the_feeder_run_as_it_reads_before_any_hand_off(batch):
    threads = {}

    def on(name, tag):
        def fn(x):
            threads.setdefault(name, set()).add(threading.current_thread().name)
            return x + [tag]
        return fn

    steps = [_step("prep", FEEDER, on("prep", "p")), _step("cnn", "cpu", on("cnn", "c"))]
    with Pipeline(steps, batch=batch) as pipe:
        assert pipe.workers == ["cpu"]  # no thread of its own
        assert list(pipe.run([i] for i in range(10))) == [[i, "p", "c"] for i in range(10)]
        stats = pipe.stats()
    assert threads == {"prep": {"edgecap-feeder"}, "cnn": {"edgecap-cpu"}}
    assert {(s.name, s.worker): s.invokes for s in stats.stages} == {("prep", FEEDER): 10, ("cnn", "cpu"): 10}
    assert [q.name for q in stats.queues] == ["source->cpu", "cpu->consumer"]
    with Pipeline(steps, pipelined=False) as pipe:  # the sequential schedule runs it inline
        assert list(pipe.run([[0]])) == [[0, "p", "c"]]
    assert threads["prep"] == {"edgecap-feeder", threading.current_thread().name}


def test_a_feeder_step_error_comes_after_the_items_before_it():
    def refuse(x):
        if x == 5:
            raise ValueError("frame 5 is not an image")
        return x

    with Pipeline([_step("prep", FEEDER, refuse), _step("cnn", "cpu")], batch=3) as pipe:
        got = []
        with pytest.raises(ValueError, match="frame 5"):
            for x in pipe.run(range(20)):
                got.append(x)
        assert got == [0, 1, 2, 3, 4]
        assert list(pipe.run([1, 2])) == [1, 2]


def test_feeder_steps_come_first_and_have_no_deadline():
    with pytest.raises(ConfigError, match="put the feeder's steps first"):
        Pipeline([_step("cnn", "cpu"), _step("prep", FEEDER)])
    with pytest.raises(ConfigError, match="no deadline"):
        Pipeline([Step("prep", FEEDER, lambda: (lambda x: x), deadline_s=1.0), _step("cnn", "cpu")])


def test_a_batch_does_not_wait_for_a_source_that_makes_each_read_wait():
    # A camera fed as a file: a frame every 30 ms. Batches of 8 would hold the first frame 0.2 s.
    read, got = {}, {}

    def paced():
        for i in range(6):
            time.sleep(0.03)
            read[i] = time.perf_counter()
            yield i

    with Pipeline([_step("a", "cpu")], batch=8) as pipe:
        for x in pipe.run(paced()):
            got[x] = time.perf_counter()
    assert sorted(got) == list(range(6))
    assert got[0] < read[3]  # out well before a batch of 8 (or 4) could have been read
