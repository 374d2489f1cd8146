"""NanoDet's decode and class map (models/nanodet.py) and the tfjs weight reader (models/tfjs_graph.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models import nanodet, scene_summary, tfjs_graph
from models.nanodet import GRID, NUM_CLASSES, REG_BINS, STRIDES


def _levels():
    scores = [np.zeros(((416 // s) ** 2, NUM_CLASSES), np.float32) for s in STRIDES]
    boxes = [np.full(((416 // s) ** 2, 4 * REG_BINS), -10.0, np.float32) for s in STRIDES]
    return scores, boxes


def test_decode_places_a_box_from_its_side_distributions_and_suppresses_its_twin():
    scores, boxes = _levels()
    side = 416 // 32
    pos = 6 * side + 6  # cell (6, 6) of stride 32: centre (208, 208)
    scores[2][pos, 5] = 0.9
    scores[2][pos + 1, 5] = 0.5  # its neighbour, mostly the same box
    for p in (pos, pos + 1):
        boxes[2][p].reshape(4, REG_BINS)[:, 2] = 10.0  # each side 2 strides = 64 px
    dets = nanodet.decode(scores, boxes, 0.3)
    assert len(dets) == 1 and dets[0].cls == 5 and dets[0].score == pytest.approx(0.9)
    assert np.allclose(dets[0].box, np.array([144, 144, 272, 272]) / 416, atol=1e-3)


def test_heat_is_each_levels_best_in_the_stride_32_cell():
    scores, _ = _levels()
    scores[0][(8 * 52) + 9, 3] = 0.7  # stride 8, cell (8, 9) -> stride-32 cell (2, 2)
    scores[2][0, 3] = 0.2
    heat = nanodet.heat_from_levels(scores)
    assert heat.shape == (GRID, GRID, NUM_CLASSES)
    assert heat[2, 2, 3] == pytest.approx(0.7) and heat[0, 0, 3] == pytest.approx(0.2)


def test_tfjs_weights_are_read_and_widened_from_float16(tmp_path):
    a = np.arange(6, dtype=np.float16).reshape(2, 3)
    b = np.array([7, -1], np.int32)
    (tmp_path / "w.bin").write_bytes(a.tobytes() + b.tobytes())
    (tmp_path / "model.json").write_text(json.dumps({"weightsManifest": [{"paths": ["w.bin"], "weights": [
        {"name": "a", "shape": [2, 3], "dtype": "float32", "quantization": {"dtype": "float16"}},
        {"name": "b", "shape": [2], "dtype": "int32"}]}]}))
    w = tfjs_graph.read_weights(tmp_path / "model.json")
    assert w["a"].dtype == np.float32 and np.array_equal(w["a"], a.astype(np.float32))
    assert np.array_equal(w["b"], b)
    (tmp_path / "w.bin").write_bytes(a.tobytes())  # shard cut short
    with pytest.raises(ValueError, match="runs past"):
        tfjs_graph.read_weights(tmp_path / "model.json")


@pytest.mark.tf
def test_the_encoder_steps_summary_equals_the_numpy_one():
    pytest.importorskip("tensorflow")
    from models.coco_bundle import summary_tf

    rng = np.random.default_rng(0)
    heat = (rng.random(nanodet.HEAT_SIZE) ** 6).astype(np.float32)
    got = summary_tf(heat[None], 0.4).numpy()[0]
    assert np.allclose(got, scene_summary.summarise(heat, 0.4), atol=1e-5)
