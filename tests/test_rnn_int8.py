"""The int8-weight RNN step models the demo bundle ships (bundle.json rnn.int8), and the float opt-out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgecap.bundle import DEMO_DIR, load_bundle
from edgecap.captioner import EdgeCaptioner
from edgecap.cli import build_parser, main
from edgecap.errors import BundleError
from edgecap.interpreter import make_cpu_interpreter
from edgecap.rnn import RnnEncoder, State


@pytest.fixture(scope="module")
def demo():
    return load_bundle(DEMO_DIR / "bundle")


def _weights(path: Path):
    """The model's weight tensors: 2-D with more than one row (every activation is ``[1, N]``)."""
    details = make_cpu_interpreter(path, 1).get_tensor_details()
    return [d for d in details if len(d["shape"]) == 2 and d["shape"][0] > 1]


@pytest.mark.parametrize("step", ["encoder_step", "decoder_step"])
def test_the_shipped_int8_steps_hold_int8_weights_where_the_float_steps_hold_float(demo, step):
    int8_path, float_path = getattr(demo.int8_steps, step), getattr(demo, step)
    assert int8_path != float_path and int8_path.stat().st_size < 0.3 * float_path.stat().st_size
    assert all(d["dtype"] == np.float32 for d in _weights(float_path))
    weights = _weights(int8_path)
    int8 = [d for d in weights if d["dtype"] == np.int8]
    # All of the fully-connected weights; only the decoder's small word embedding stays float.
    assert sum(np.prod(d["shape"]) for d in int8) >= 0.98 * sum(np.prod(d["shape"]) for d in weights)
    for d in int8:
        scales, zero_points = d["quantization_parameters"]["scales"], d["quantization_parameters"]["zero_points"]
        # Symmetric, one scale per tensor (the interpreter may repeat it per row).
        assert scales.min() == scales.max() > 0 and not zero_points.any()


def test_the_int8_steps_run_by_default_and_caption_the_sample_as_the_float_steps_do(demo, monkeypatch):
    opened = []
    init = RnnEncoder.__init__

    def spy(self, path, *args, **kwargs):
        opened.append(Path(path))
        init(self, path, *args, **kwargs)

    monkeypatch.setattr(RnnEncoder, "__init__", spy)
    captions = {}
    for float_rnn in (False, True):
        opened.clear()
        with EdgeCaptioner(demo, pipelined=False, float_rnn=float_rnn) as cap:
            captions[float_rnn] = [c.text for c in cap.stream(str(DEMO_DIR / "sample.mp4"))]
        assert set(opened) == {demo.encoder_step if float_rnn else demo.int8_steps.encoder_step}
    truth = [w["caption"] for w in json.loads((DEMO_DIR / "sample.json").read_text())["windows"]]
    assert captions[False] == captions[True] == truth


def test_the_int8_encoder_step_keeps_the_float_steps_state_within_quantisation_error(demo):
    floats, int8s = RnnEncoder(demo.encoder_step), RnnEncoder(demo.int8_steps.encoder_step)
    rng = np.random.default_rng(0)
    state_f = state_q = State.zeros(demo.hidden_size)
    for _ in range(demo.window.frames):
        feature = rng.normal(0, 1, demo.feature_size).astype(np.float32)
        state_f, state_q = floats.step(feature, state_f), int8s.step(feature, state_q)
    assert not np.array_equal(state_f.h, state_q.h)  # it is another model ...
    assert np.abs(state_f.h - state_q.h).max() < 0.05  # ... close to the float one


def test_float_rnn_is_a_caption_flag():
    args = build_parser().parse_args(["caption", "--float-rnn"])
    assert args.float_rnn is True
    assert build_parser().parse_args(["caption"]).float_rnn is False


def _copy_demo(tmp_path: Path, **int8) -> Path:
    root = tmp_path / "bundle"
    shutil.copytree(DEMO_DIR / "bundle", root)
    meta = json.loads((root / "bundle.json").read_text())
    meta["rnn"]["int8"].update(int8)
    (root / "bundle.json").write_text(json.dumps(meta))
    return root


def test_an_int8_step_that_is_not_its_float_steps_twin_is_refused_in_one_line(tmp_path, capsys):
    root = _copy_demo(tmp_path, encoder_step="rnn_decoder_step_int8.tflite")
    with pytest.raises(BundleError, match="rnn_decoder_step_int8.tflite") as err:
        load_bundle(root)
    assert "\n" not in str(err.value)
    assert main(["validate", str(root)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_missing_int8_step_is_named_with_its_field(tmp_path):
    root = _copy_demo(tmp_path, decoder_step="gone.tflite")
    with pytest.raises(BundleError, match=r"rnn\.int8\.decoder_step"):
        load_bundle(root)
