"""One tiny run of the training + export recipe (models/train.py); needs TensorFlow."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.tf


def test_tiny_training_run_writes_a_complete_int8_bundle(tmp_path):
    pytest.importorskip("tensorflow")
    from edgecap.interpreter import make_cpu_interpreter
    from models import dataset, train

    dataset.write_dataset(tmp_path / "data", 10, seed=0, size=64)
    out = tmp_path / "bundle"
    figures = train.train(train.parse_args([
        "--data", str(tmp_path / "data"), "--out", str(out), "--seed", "0",
        "--epochs", "1", "--finetune-epochs", "1", "--batch", "4",
        "--width", "0.25", "--feature-size", "16", "--hidden-size", "16",
        "--calibration-frames", "8", "--threads", "1",
    ]))

    meta = json.loads((out / "bundle.json").read_text())
    files = [meta["encoder"], meta["reference_encoder"], meta["rnn"]["encoder_step"],
             meta["rnn"]["decoder_step"], meta["vocab"]]
    assert all((out / f).is_file() for f in files)
    assert meta["schema_version"] == 1 and meta["feature_size"] == 16
    assert meta["rnn"]["hidden_size"] == 16
    assert 0.0 <= figures["int8_float_agreement"] <= 1.0

    encoder = make_cpu_interpreter(out / meta["encoder"])
    (inp,), (outp,) = encoder.get_input_details(), encoder.get_output_details()
    assert inp["dtype"] == np.int8 and outp["dtype"] == np.int8
    assert list(inp["shape"]) == [1, 64, 64, 3] and list(outp["shape"]) == [1, 16]

    vocab = (out / meta["vocab"]).read_text().splitlines()
    assert vocab[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    decoder = make_cpu_interpreter(out / meta["rnn"]["decoder_step"])
    signature = decoder.get_signature_list()["serving_default"]
    assert sorted(signature["inputs"]) == ["c", "h", "word"]
    assert sorted(signature["outputs"]) == ["c_out", "h_out", "logits"]
    logits = decoder.get_signature_runner("serving_default")(
        word=np.array([1], np.int32), h=np.zeros((1, 16), np.float32), c=np.zeros((1, 16), np.float32)
    )["logits"]
    assert logits.shape == (1, len(vocab))
    step = make_cpu_interpreter(out / meta["rnn"]["encoder_step"]).get_signature_list()
    assert sorted(step["serving_default"]["inputs"]) == ["c", "feature", "h"]
    # The int8-weight steps beside them: the bundle validates with them (same inputs and outputs).
    from edgecap.bundle import load_bundle

    int8 = load_bundle(out).int8_steps
    assert int8 is not None and int8.encoder_step.name == meta["rnn"]["int8"]["encoder_step"]
    weights = [d for d in make_cpu_interpreter(int8.decoder_step).get_tensor_details()
               if len(d["shape"]) == 2 and d["shape"][0] > 1 and d["dtype"] == np.int8]
    assert weights  # the fully-connected weights


def test_same_data_seed_and_arguments_give_the_same_model_files(tmp_path):
    pytest.importorskip("tensorflow")
    from models import dataset, train

    dataset.write_dataset(tmp_path / "data", 12, seed=3, size=64)
    outs = []
    for run in ("a", "b"):
        outs.append(tmp_path / run)
        train.train(train.parse_args([
            "--data", str(tmp_path / "data"), "--out", str(outs[-1]), "--seed", "5",
            "--epochs", "2", "--finetune-epochs", "1", "--batch", "4",
            "--width", "0.25", "--feature-size", "16", "--hidden-size", "16",
            "--calibration-frames", "8", "--threads", "2",
        ]))
    # bundle.json differs only in the provenance's wall times.
    models = sorted(p.name for p in outs[0].glob("*.tflite"))
    assert len(models) == 6  # encoder, its float reference, two float RNN steps and their int8 twins
    for name in models:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
