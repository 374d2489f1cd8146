"""Segment writer: valid segments whose chained outputs are bit-identical to the whole model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert.tools import flatbuffer_utils

from edgecap.interpreter import make_cpu_interpreter
from edgecap_compile.graph import read_graph
from edgecap_compile.segments import build_segment, segment_name, write_segments

DATA = Path(__file__).parent / "data" / "compile"
FIXTURES = ["tiny_mobilenet", "tiny_inception", "tiny_densenet"]
DEMO_ENCODER = Path(__file__).parent.parent / "models" / "demo" / "bundle" / "encoder.tflite"


def _run(model, feeds):
    interp = make_cpu_interpreter(model)
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], feeds[d["name"]])
    interp.invoke()
    return {d["name"]: interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()}


def _random_input(graph, rng):
    t = graph.tensors[graph.inputs[0]]
    return {t.name: rng.integers(-128, 128, size=t.shape, dtype=np.int8)}


def _chained(graph, cuts, feeds):
    # The runtime's view: every boundary tensor travels by name; later stages
    # read whatever earlier stages (or the model input) produced.
    env = dict(feeds)
    for a, b in zip(cuts, cuts[1:]):
        if b > a:
            env.update(_run(build_segment(graph, a, b), env))
    return env


def _assert_chain_exact(path: Path, cut_sets, inputs: int = 3):
    graph = read_graph(path)
    n = len(graph.ops)
    rng = np.random.default_rng(0)
    boundaries = {t for cuts in cut_sets for c in cuts[1:-1] for t in graph.live_across(c)
                  if graph.producer[t] >= 0}
    # The reference: the whole graph in one interpreter, boundary tensors exposed.
    reference = build_segment(graph, 0, n, extra_outputs=sorted(boundaries))
    seen = []
    for _ in range(inputs):
        feeds = _random_input(graph, rng)
        whole = _run(str(path), feeds)
        inside = _run(reference, feeds)
        seen.append(inside)
        for cuts in cut_sets:
            chained = _chained(graph, cuts, feeds)
            for name, value in {**whole, **inside}.items():
                if name in chained:
                    assert np.array_equal(chained[name], value), (path.name, cuts, name)
            assert all(name in chained for name in whole)
    # The check means something only if the values depend on the input.
    assert any(not np.array_equal(seen[0][k], seen[1][k]) for k in seen[0])


@pytest.mark.parametrize("name", FIXTURES)
def test_every_single_cut_chains_bit_identically(name):
    n = len(read_graph(DATA / f"{name}.tflite").ops)
    _assert_chain_exact(DATA / f"{name}.tflite", [(0, c, n) for c in range(1, n)], inputs=2)


@pytest.mark.parametrize("name", FIXTURES)
def test_random_multi_cut_chains_bit_identically(name):
    n = len(read_graph(DATA / f"{name}.tflite").ops)
    rng = np.random.default_rng(1)
    cut_sets = [(0, *sorted(rng.choice(np.arange(1, n), size=3, replace=False)), n)
                for _ in range(5)]
    _assert_chain_exact(DATA / f"{name}.tflite", cut_sets)


@pytest.mark.skipif(not DEMO_ENCODER.is_file(), reason="demo bundle encoder not built yet")
def test_demo_encoder_chains_bit_identically():
    n = len(read_graph(DEMO_ENCODER).ops)
    _assert_chain_exact(DEMO_ENCODER, [(0, n // 3, 2 * n // 3, n), (0, n // 2, n)])


def test_segments_keep_names_and_only_what_they_reference(tmp_path):
    graph = read_graph(DATA / "tiny_inception.tflite")
    n = len(graph.ops)
    segments = write_segments(graph, [(0, 7), (7, 7), (7, n)], tmp_path)
    assert [s.path.name for s in segments] == [segment_name("tiny_inception", i, 2) for i in (0, 1)]
    for seg in segments:
        model = flatbuffer_utils.read_model(str(seg.path))
        sub = model.subgraphs[0]
        start, end = seg.ops
        assert len(sub.operators) == end - start
        names = [sub.tensors[i].name.decode() for i in sub.inputs]
        assert names == [graph.tensors[t].name for t in seg.inputs]
        assert [sub.tensors[i].name.decode() for i in sub.outputs] == [
            graph.tensors[t].name for t in seg.outputs]
        used_codes = {op.opcodeIndex for op in sub.operators}
        assert used_codes == set(range(len(model.operatorCodes)))
        referenced = {t.buffer for t in sub.tensors} | {m.buffer for m in model.metadata or []}
        assert referenced | {0} == set(range(len(model.buffers)))
        source_types = {graph.ops[i].type for i in range(start, end)}
        assert len(model.operatorCodes) == len(source_types)
    assert segments[0].outputs and set(segments[0].outputs) <= set(segments[1].inputs) | set(
        graph.live_across(7))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["MobileNetV2", "ResNet50", "InceptionV3", "EfficientNetB0"])
def test_keras_architectures_chain_bit_identically(arch):
    from edgecap_lab.keras_zoo import model_path

    try:
        path = model_path(arch, generate=False)
    except FileNotFoundError:
        pytest.skip(f"{arch} not cached: python -m edgecap_lab.keras_zoo")
    n = len(read_graph(path).ops)
    rng = np.random.default_rng(2)
    cut_sets = [(0, *sorted(rng.choice(np.arange(1, n), size=3, replace=False)), n)
                for _ in range(4)]
    _assert_chain_exact(path, cut_sets, inputs=2)
