"""The pipelined captioner against the sequential CPU path, for every plan shape."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import pipeline_threads

from edgecap.bundle import load_bundle
from edgecap.captioner import EdgeCaptioner
from edgecap.stages import open_stage
from edgecap.plans.plan import load_plan, single_cpu_plan
from edgecap.preprocess import Preprocessor
from edgecap.errors import ConfigError, PlanError
from edgecap.sources import ArraySource
from edgecap.trace import load_slices
from runtime_plans import write_plan
from edgecap_compile.graph import read_graph

# Plan shapes: 0, 1 and 2 TPUs, with and without a CPU tail, and an empty stage.
# Cuts are fractions of the encoder's ops; they land inside residual blocks, so
# skip tensors pass through stages.
SHAPES = {
    "cpu": ([], ["cpu"]),
    "1tpu": ([], ["tpu:0"]),
    "1tpu+cpu": ([0.5], ["tpu:0", "cpu"]),
    "2tpu": ([0.3], ["tpu:0", "tpu:1"]),
    "2tpu+cpu": ([0.3, 0.6], ["tpu:0", "tpu:1", "cpu"]),
    "empty+tpu+cpu": ([0.0, 0.6], ["tpu:0", "tpu:1", "cpu"]),
}


pytestmark = pytest.mark.usefixtures("no_leaked_threads")


@pytest.fixture(scope="module")
def plans(shipped_bundle: Path, tmp_path_factory) -> dict:
    encoder = shipped_bundle / "encoder.tflite"
    n = len(read_graph(encoder).ops)
    out = {}
    for name, (fractions, devs) in SHAPES.items():
        cuts = [int(f * n) for f in fractions]
        out[name] = write_plan(encoder, cuts, devs, tmp_path_factory.mktemp(name), [0.3] * len(devs))
    return out


def _clip(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (n, 72, 88, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def clips():
    return [_clip(16, 1), _clip(24, 2)]


@pytest.fixture(scope="module")
def reference(shipped_bundle: Path, clips) -> list:
    with EdgeCaptioner(shipped_bundle, pipelined=False, num_threads=1, frames=4, stride=2) as cap:
        return [[(c.window, c.start_frame, c.end_frame, c.tokens) for c in cap.caption_frames(clip)]
                for clip in clips]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_pipelined_captions_equal_the_sequential_cpu_path(shape, plans, shipped_bundle, clips, reference):
    with EdgeCaptioner(shipped_bundle, plan=plans[shape], num_threads=1, frames=4, stride=2) as cap:
        assert all(d.startswith(("emu-tpu", "cpu")) for d in cap.devices.values())
        got = [[(c.window, c.start_frame, c.end_frame, c.tokens) for c in cap.caption_frames(clip)]
               for clip in clips]
        stats = cap.stats()
    assert got == reference
    assert len(got[1]) == 11
    stage_names = {s.name for s in stats.stages}
    assert {"rnn_step", "decode"} <= stage_names and stats.frames_out == 24


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_plan_shape_computes_the_encoders_exact_features(shape, plans, shipped_bundle, clips):
    # Captions of a weak model can agree by luck; the features may not differ at all.
    plan = load_plan(plans[shape])
    runners = [open_stage(s, "cpu") for s in plan.active_stages]
    whole = open_stage(single_cpu_plan(shipped_bundle / "encoder.tflite").stages[0], "cpu")
    spec = plan.inputs[0]
    preprocess = Preprocessor(load_bundle(shipped_bundle).input,
                              {"dtype": np.dtype(spec.dtype), "quantization": (spec.scale, spec.zero_point)})
    inputs = [preprocess(image) for image in clips[1]]
    for x in inputs:
        tensors = {plan.inputs[0].name: x}
        for run in runners:
            tensors = run(tensors)
        (expected,) = whole({plan.inputs[0].name: x}).values()
        np.testing.assert_array_equal(tensors[plan.outputs[0].name], expected)
    assert len({x.tobytes() for x in inputs}) == len(inputs)


def test_tpu_stages_run_on_their_own_emulated_devices(plans, shipped_bundle):
    with EdgeCaptioner(shipped_bundle, plan=plans["2tpu+cpu"], num_threads=1) as cap:
        assert cap.devices == {"tpu:0": "emu-tpu:0", "tpu:1": "emu-tpu:1", "cpu": "cpu"}
        list(cap.stream(_clip(16, 3), fps=0))
        util = cap.stats().worker_utilization()
    assert set(util) == {"preprocess", "emu-tpu:0", "emu-tpu:1", "cpu", "decode"}


def test_device_override_runs_tpu_stages_on_cpu_workers(plans, shipped_bundle, reference, clips):
    with EdgeCaptioner(shipped_bundle, plan=plans["2tpu+cpu"], num_threads=1, frames=4, stride=2,
                       devices_map={"tpu:0": "cpu:1", "tpu:1": "cpu:2"}) as cap:
        got = [(c.window, c.start_frame, c.end_frame, c.tokens) for c in cap.caption_frames(clips[0])]
        workers = {s.worker for s in cap.stats().stages}
    assert got == reference[0]
    assert workers == {"preprocess", "cpu:1", "cpu:2", "cpu", "decode"}


@pytest.mark.parametrize("batch", [3, 8])
def test_batched_hand_offs_give_the_same_captions(plans, shipped_bundle, reference, clips, batch):
    with EdgeCaptioner(shipped_bundle, plan=plans["2tpu+cpu"], num_threads=1, frames=4, stride=2,
                       devices_map={"tpu:0": "cpu:1", "tpu:1": "cpu:2"}, batch=batch) as cap:
        got = [[(c.window, c.start_frame, c.end_frame, c.tokens) for c in cap.caption_frames(clip)]
               for clip in clips]
        assert cap.stats().frames_out == 24
    assert got == reference


def test_stopping_mid_stream_leaves_no_thread_behind(plans, shipped_bundle):
    cap = EdgeCaptioner(shipped_bundle, plan=plans["2tpu+cpu"], num_threads=1)
    it = cap.stream(_clip(400, 4), fps=0)
    next(it)
    assert len(pipeline_threads()) >= 4  # three devices, the decoder, the feeder
    it.close()
    assert [t.name for t in pipeline_threads()] != [] and "edgecap-feeder" not in [
        t.name for t in pipeline_threads()]
    cap.close()
    assert pipeline_threads() == []


def test_breaking_out_of_a_with_block_joins_every_thread(plans, shipped_bundle):
    with EdgeCaptioner(shipped_bundle, plan=plans["1tpu+cpu"], num_threads=1) as cap:
        for _ in cap.stream(_clip(400, 5), fps=0):
            break
    assert pipeline_threads() == []


def test_slow_consumer_stalls_the_source_instead_of_growing(plans, shipped_bundle):
    pulled = {"n": 0}

    def frames():
        for image in _clip(2000, 6):
            pulled["n"] += 1
            yield image

    with EdgeCaptioner(shipped_bundle, plan=plans["2tpu+cpu"], num_threads=1, queue_size=2) as cap:
        it = cap.stream(frames(), fps=0)
        next(it)
        time.sleep(0.3)
        stalled_at = pulled["n"]
        time.sleep(0.3)
        assert pulled["n"] == stalled_at  # nothing read while nobody consumes
        # One window consumed plus what the bounded queues and workers hold.
        assert stalled_at <= cap.window.frames + 2 * 6 + 6
        it.close()


class _Camera(ArraySource):
    live = True

    def __iter__(self):
        # A frame every ~0.1 ms (sleep's granularity): a camera's own pace, now that
        # preprocessing no longer slows the thread that reads it.
        for frame in super().__iter__():
            time.sleep(1e-4)
            yield frame


def test_live_source_drops_frames_instead_of_queuing(plans, shipped_bundle):
    # A "camera" faster than TPU stages paced at 0.3 ms: most frames must drop.
    with EdgeCaptioner(shipped_bundle, plan=plans["2tpu+cpu"], num_threads=1, sample_fps=0) as cap:
        caps = list(cap.stream(_Camera(_clip(600, 7), fps=1000.0)))
        stats = cap.stats()
    assert stats.dropped > 0 and stats.frames_in == 600
    assert stats.frames_out == 600 - stats.dropped
    assert len(caps) == stats.frames_out // cap.window.frames
    assert all(c.end_frame > c.start_frame for c in caps)
    assert caps[-1].end_frame - caps[-1].start_frame >= cap.window.frames - 1


def test_trace_of_a_pipelined_run(plans, shipped_bundle, tmp_path):
    path = tmp_path / "trace.json"
    with EdgeCaptioner(shipped_bundle, plan=plans["2tpu+cpu"], num_threads=1, trace=path) as cap:
        list(cap.stream(_clip(16, 8), fps=0))
    tracks = load_slices(path)
    assert set(tracks) == {"source", "preprocess", "emu-tpu:0", "emu-tpu:1", "cpu", "decode"}
    assert [s["args"]["frame"] for s in tracks["emu-tpu:1"]] == list(range(16))
    assert all(s["dur"] >= 300 for s in tracks["emu-tpu:0"])  # paced to 0.3 ms
    # Pipelined: TPU 0 starts frame t+1 before the CPU finishes frame t.
    cpu_end = {s["args"]["frame"]: s["ts"] + s["dur"] for s in tracks["cpu"] if s["name"] == "rnn_step"}
    tpu_start = {s["args"]["frame"]: s["ts"] for s in tracks["emu-tpu:0"]}
    assert any(tpu_start[f + 1] < cpu_end[f] for f in range(15))


def test_timing_only_emulation_still_yields_every_window(plans, shipped_bundle):
    with EdgeCaptioner(shipped_bundle, plan=plans["2tpu+cpu"], timing_only=True) as cap:
        caps = cap.caption_frames(_clip(16, 9))
    assert [c.window for c in caps] == [0, 1]


def test_plan_for_another_model_is_rejected(shipped_bundle, tmp_path):
    tiny = Path(__file__).resolve().parent / "data" / "runtime" / "tiny_encoder.tflite"
    write_plan(tiny, [], ["cpu"], tmp_path)
    with pytest.raises(PlanError, match="bundle's encoder"):
        EdgeCaptioner(shipped_bundle, plan=tmp_path)


@pytest.mark.parametrize("key", ["TPU:0", ":0", "tpu:0"])
def test_devices_map_keys_are_device_strings_in_any_spelling(plans, shipped_bundle, key):
    with EdgeCaptioner(shipped_bundle, plan=plans["2tpu+cpu"], num_threads=1,
                       devices_map={key: "CPU:1"}) as cap:
        assert cap.devices == {"tpu:0": "cpu:1", "tpu:1": "emu-tpu:1", "cpu": "cpu"}


@pytest.mark.parametrize("devices_map,message", [
    ({"tpu:7": "cpu:1"}, "names tpu:7, which the plan does not use; map the plan's devices: tpu:0, tpu:1, cpu"),
    ({"usb:0": "cpu:1"}, "names usb:0, which the plan does not use"),
    ({"tpu:0": "cpu"}, r"puts stage 0 \(tpu:0\) and stage 2 \(cpu\) on worker cpu .* e.g. cpu:1"),
    ({"tpu:0": "cpu:1", "cpu": "cpu:1"}, r"puts stage 0 \(tpu:0\) and stage 2 \(cpu\) on worker cpu:1"),
])
def test_devices_map_that_cannot_run_is_a_config_error(plans, shipped_bundle, devices_map, message):
    with pytest.raises(ConfigError, match=message):
        EdgeCaptioner(shipped_bundle, plan=plans["2tpu+cpu"], num_threads=1, devices_map=devices_map)


def test_plan_for_another_model_of_the_same_shape_is_rejected(shipped_bundle, tmp_path):
    plan = write_plan(shipped_bundle / "encoder.tflite", [], ["cpu"], tmp_path)
    doc = json.loads(plan.read_text())
    doc["model"]["sha256"] = "0" * 64
    plan.write_text(json.dumps(doc))
    with pytest.raises(PlanError, match="compiled from another model .* re-run `edgecap compile "):
        EdgeCaptioner(shipped_bundle, plan=plan)


def test_sample_clip_through_two_emulated_tpus_equals_the_cpu_path(plans, shipped_bundle):
    clip = Path(__file__).resolve().parent.parent / "models" / "demo" / "sample.mp4"
    if not clip.is_file():
        pytest.skip("no shipped sample clip")
    with EdgeCaptioner(shipped_bundle, pipelined=False, num_threads=1) as cap:
        expected = [(c.window, c.start_frame, c.text) for c in cap.stream(str(clip))]
    with EdgeCaptioner(shipped_bundle, plan=plans["2tpu+cpu"], num_threads=1) as cap:
        got = [(c.window, c.start_frame, c.text) for c in cap.stream(str(clip))]
    assert got == expected and len(got) >= 2
    truth = json.loads(clip.with_suffix(".json").read_text())["windows"]
    assert [(c[1], c[2]) for c in got] == [(w["start_frame"], w["caption"]) for w in truth]


def test_a_timing_only_board_run_paces_the_lstm_step_without_computing_it(shipped_bundle, monkeypatch):
    from edgecap import rnn

    def refuse(*args, **kwargs):
        raise AssertionError("a timing-only board run computed an LSTM step")

    monkeypatch.setattr(rnn.RnnEncoder, "step", refuse)
    with EdgeCaptioner(shipped_bundle, board="devboard-usb", timing_only=True, num_threads=1) as cap:
        assert cap.plan.rnn_ms > 0  # so the step is paced, and needs no compute
        caps = cap.caption_frames(_clip(16, 9))
    assert [c.window for c in caps] == [0, 1]
