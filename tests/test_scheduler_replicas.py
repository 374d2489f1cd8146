"""A replicated step: items dealt to its copies by weight, put back in input order after them."""

from __future__ import annotations

import random
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from edgecap.errors import ConfigError, RunCancelled
from edgecap.scheduler import Pipeline, Replicas, Step, _Deal
from edgecap.trace import Tracer, load_slices


def _threads():
    return [t for t in threading.enumerate() if t.name.startswith("edgecap-")]


@pytest.fixture(autouse=True)
def no_leaked_threads():
    yield
    assert _threads() == []


def _copy(worker, weight, seconds=0.0, seen=None, jitter=0.0):
    def open_():
        rng = random.Random(worker)

        def fn(x):
            time.sleep(seconds + rng.random() * jitter)
            if seen is not None:
                seen.append((worker, x[0]))
            return x + [worker]
        return fn
    return Step(f"cnn ({worker})", worker, open_, weight=weight)


def _pipeline(copies, **kw):
    steps = [Step("pre", "pre", lambda: (lambda x: [x])), Replicas(tuple(copies)),
             Step("rnn", "cpu", lambda: (lambda x: x + ["rnn"]))]
    return Pipeline(steps, **kw)


def test_items_come_out_in_order_though_the_copies_finish_out_of_order():
    seen = []
    copies = [_copy("tpu:0", 0.5, 0.0, seen, jitter=0.004), _copy("tpu:1", 0.5, 0.002, seen, jitter=0.004)]
    with _pipeline(copies) as pipe:
        out = list(pipe.run(range(60)))
        assert pipe.workers == ["pre", "tpu:0", "tpu:1", "cpu"]
    assert [x[0] for x in out] == list(range(60))
    assert all(x[-1] == "rnn" for x in out)
    # Each copy took its share, alternating (weights 1:1).
    assert [w for w, i in sorted(seen, key=lambda s: s[1])] == ["tpu:0", "tpu:1"] * 30


def test_frames_are_dealt_in_proportion_to_the_weights_deterministically():
    deal = _Deal([0.6, 0.3, 0.1])
    picks = [deal.next() for _ in range(1000)]
    assert [picks.count(i) for i in range(3)] == [600, 300, 100]
    again = _Deal([0.6, 0.3, 0.1])
    assert [again.next() for _ in range(1000)] == picks
    # Spread evenly: every 10 items hold each copy's share.
    assert all(picks[k:k + 10].count(2) == 1 for k in range(0, 1000, 10))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0.05, 1.0), min_size=2, max_size=4), st.integers(1, 3), st.integers(1, 3),
       st.booleans())
def test_order_and_counts_hold_for_any_weights_queue_and_batch(weights, queue, batch, pipelined):
    seen = []
    copies = [_copy(f"tpu:{i}", w, 0.0, seen, jitter=0.0005) for i, w in enumerate(weights)]
    with _pipeline(copies, queue_size=queue, batch=batch, pipelined=pipelined) as pipe:
        out = list(pipe.run(range(40)))
    assert [x[0] for x in out] == list(range(40))
    assert sorted(i for _, i in seen) == list(range(40))
    stats = pipe.stats()
    assert [s.invokes for s in stats.stages if s.name.startswith("cnn")] == \
        [sum(1 for w, _ in seen if w == f"tpu:{i}") for i in range(len(weights))]


def test_the_sequential_schedule_deals_the_same_way():
    runs = []
    for pipelined in (True, False):
        seen = []
        copies = [_copy("tpu:0", 0.7, seen=seen), _copy("tpu:1", 0.3, seen=seen)]
        with _pipeline(copies, pipelined=pipelined) as pipe:
            assert [x[0] for x in pipe.run(range(20))] == list(range(20))
        runs.append(sorted(seen, key=lambda s: s[1]))
    assert runs[0] == runs[1]


def test_an_error_in_a_copy_reaches_the_consumer_after_every_item_before_it():
    def open_():
        def fn(x):
            if x[0] == 6:
                raise ValueError("boom")
            time.sleep(0.001)
            return x
        return fn
    copies = [Step("cnn (tpu:0)", "tpu:0", open_, weight=0.5), _copy("tpu:1", 0.5, 0.003)]
    with _pipeline(copies) as pipe:
        got = []
        with pytest.raises(ValueError, match="boom"):
            for x in pipe.run(range(30)):
                got.append(x[0])
        assert got == list(range(6))
        # The pipeline runs again, from a fresh deal.
        assert [x[0] for x in pipe.run(range(5))] == list(range(5))


def test_a_run_stopped_midway_leaves_the_copies_ready_for_the_next():
    copies = [_copy("tpu:0", 0.5, 0.002), _copy("tpu:1", 0.5, 0.001)]
    with _pipeline(copies) as pipe:
        for x in pipe.run(range(1000)):
            if x[0] == 10:
                break
        assert [x[0] for x in pipe.run(range(50))] == list(range(50))
        run = pipe.run(range(1000))
        next(run)
        pipe.cancel()
        with pytest.raises(RunCancelled):
            list(run)


def test_each_copy_is_a_track_of_the_trace(tmp_path):
    tracer = Tracer()
    with _pipeline([_copy("tpu:0", 0.5), _copy("tpu:1", 0.5)], tracer=tracer) as pipe:
        list(pipe.run(range(10)))
    tracer.write(tmp_path / "t.json")
    slices = load_slices(tmp_path / "t.json")
    assert sorted(s["args"]["frame"] for s in slices["tpu:0"]) == [0, 2, 4, 6, 8]
    assert sorted(s["args"]["frame"] for s in slices["tpu:1"]) == [1, 3, 5, 7, 9]


@pytest.mark.parametrize("steps, message", [
    ([Replicas((Step("a", "x", lambda: None), Step("a", "y", lambda: None)))], "first step"),
    ([Step("p", "p", lambda: None), Replicas((Step("a", "x", lambda: None),))], "at least two"),
    ([Step("p", "p", lambda: None), Replicas((Step("a", "x", lambda: None, accepts=bool),
                                              Step("a", "y", lambda: None)))], "accepts"),
    ([Step("p", "p", lambda: None), Replicas((Step("a", "x", lambda: None, weight=0.0),
                                              Step("a", "y", lambda: None)))], "weight"),
])
def test_a_replicated_step_that_cannot_run_is_one_line(steps, message):
    with pytest.raises(ConfigError, match=message):
        Pipeline(steps)
