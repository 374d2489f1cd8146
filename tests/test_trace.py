"""The tracer: memory bounded in bytes, the newest slices kept, a valid trace-event file."""

from __future__ import annotations

import threading
import tracemalloc

import pytest

from edgecap.errors import ConfigError
from edgecap.trace import DEFAULT_MAX_BYTES, SLICE_BYTES, Tracer, load_slices


def test_default_budget_is_32_mib_and_a_slice_is_a_packed_record():
    tracer = Tracer()
    assert tracer.nbytes <= DEFAULT_MAX_BYTES == 32 * 2**20
    assert SLICE_BYTES == 28  # track, name (16-bit ids), frame (64-bit), start, end
    assert tracer.capacity == DEFAULT_MAX_BYTES // SLICE_BYTES


def test_memory_stays_within_the_byte_budget_however_many_slices(tmp_path):
    budget = 256 * 1024
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracer = Tracer(max_bytes=budget)
        tracer.add_tracks(["tpu:0", "cpu"])
        for i in range(5 * tracer.capacity):  # five times what fits
            tracer.slice("tpu:0" if i % 2 else "cpu", f"stage{i % 3}", i, float(i), i + 0.5)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert tracer.capacity == budget // SLICE_BYTES
    # The ring itself, plus the interned names and the tracer object.
    assert held <= budget + 8 * 1024, held
    path = tmp_path / "t.json"
    tracer.write(path)
    tracks = load_slices(path)
    kept = sorted(e["args"]["frame"] for slices in tracks.values() for e in slices)
    total = 5 * tracer.capacity
    assert kept == list(range(total - tracer.capacity, total))  # exactly the newest


def test_slices_from_many_threads_are_all_kept_under_the_budget(tmp_path):
    tracer = Tracer()
    tracks = [f"w{i}" for i in range(4)]
    tracer.add_tracks(tracks)

    def work(track):
        for i in range(2000):
            tracer.slice(track, "step", i, i * 1e-3, i * 1e-3 + 5e-4)

    threads = [threading.Thread(target=work, args=(t,)) for t in tracks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tracer.write(tmp_path / "t.json")
    got = load_slices(tmp_path / "t.json")
    assert {k: [e["args"]["frame"] for e in v] for k, v in got.items()} == {t: list(range(2000)) for t in tracks}
    assert all(e["dur"] == pytest.approx(500.0) for e in got["w0"])


def test_slice_times_are_microseconds_from_the_tracer_start(tmp_path):
    tracer = Tracer(max_bytes=SLICE_BYTES * 4)
    tracer.add_tracks(["cpu"])
    origin = tracer._origin
    tracer.slice("cpu", "tail", 7, origin + 0.001, origin + 0.0035)
    events = tracer.events()
    assert [e["args"]["name"] for e in events if e["name"] == "thread_name"] == ["cpu"]
    (x,) = [e for e in events if e["ph"] == "X"]
    assert (x["name"], x["args"]["frame"]) == ("tail", 7)
    assert x["ts"] == pytest.approx(1000.0) and x["dur"] == pytest.approx(2500.0)


def test_a_budget_below_one_slice_is_a_config_error():
    with pytest.raises(ConfigError, match="max_bytes 10: too small for one slice"):
        Tracer(max_bytes=10)


def test_writing_a_full_trace_needs_little_memory_beyond_the_ring(tmp_path):
    budget = 2**20
    tracer = Tracer(max_bytes=budget)
    tracer.add_tracks(["cpu"])
    for i in range(tracer.capacity + 100):
        tracer.slice("cpu", "tail", i, float(i), i + 0.25)
    tracemalloc.start()
    try:
        tracer.write(tmp_path / "t.json")
        extra = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert extra < budget / 2, extra  # a list of dicts, as before, took 544 bytes a slice
    frames = [e["args"]["frame"] for e in load_slices(tmp_path / "t.json")["cpu"]]
    assert frames == list(range(100, tracer.capacity + 100))
