"""Each way a bundle can be broken gets its own one-line error naming the file and field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgecap.bundle import load_bundle
from edgecap.errors import BundleError

from conftest import DATA


def _edit(bundle: Path, **changes: object) -> None:
    meta = json.loads((bundle / "bundle.json").read_text())
    for dotted, value in changes.items():
        node = meta
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    (bundle / "bundle.json").write_text(json.dumps(meta))


def _error(bundle: Path) -> str:
    with pytest.raises(BundleError) as e:
        load_bundle(bundle)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_shipped_bundle_is_valid(shipped_bundle: Path) -> None:
    b = load_bundle(shipped_bundle)
    assert b.encoder.parent == b.root
    assert len(b.vocab) > 4
    assert b.detokenize([b.tokens.bos, 4, b.tokens.eos]) == b.vocab[4]


def test_missing_directory(tmp_path: Path) -> None:
    assert "bundle directory not found" in _error(tmp_path / "nope")


def test_missing_bundle_json(bundle_copy: Path) -> None:
    (bundle_copy / "bundle.json").unlink()
    assert "bundle.json: missing" in _error(bundle_copy)


def test_malformed_json(bundle_copy: Path) -> None:
    (bundle_copy / "bundle.json").write_text("{ not json")
    assert "not valid JSON" in _error(bundle_copy)


def test_missing_file(bundle_copy: Path) -> None:
    (bundle_copy / "vocab.txt").unlink()
    msg = _error(bundle_copy)
    assert "vocab.txt" in msg and "'vocab'" in msg and "missing" in msg


def test_missing_field(bundle_copy: Path) -> None:
    meta = json.loads((bundle_copy / "bundle.json").read_text())
    del meta["rnn"]["decoder_step"]
    (bundle_copy / "bundle.json").write_text(json.dumps(meta))
    assert "'rnn.decoder_step' is missing" in _error(bundle_copy)


def test_wrong_type(bundle_copy: Path) -> None:
    _edit(bundle_copy, window__frames="8")
    assert "'window.frames' must be int" in _error(bundle_copy)


def test_truncated_flatbuffer(bundle_copy: Path) -> None:
    enc = bundle_copy / "encoder.tflite"
    enc.write_bytes(enc.read_bytes()[: enc.stat().st_size // 3])
    msg = _error(bundle_copy)
    assert "encoder.tflite" in msg and "corrupt or truncated" in msg


def test_corrupt_flatbuffer(bundle_copy: Path) -> None:
    step = bundle_copy / "rnn_decoder_step.tflite"
    data = bytearray(step.read_bytes())
    data[8:] = bytes(len(data) - 8)  # keep the header, zero the tables
    step.write_bytes(bytes(data))
    msg = _error(bundle_copy)
    assert "rnn_decoder_step.tflite" in msg and "corrupt or truncated" in msg


def test_not_a_tflite_file(bundle_copy: Path) -> None:
    (bundle_copy / "encoder.tflite").write_text("hello")
    assert "not a TFLite model" in _error(bundle_copy)


def test_float_encoder(bundle_copy: Path) -> None:
    meta = json.loads((bundle_copy / "bundle.json").read_text())
    assert meta.get("reference_encoder"), "the shipped bundle carries its float encoder"
    _edit(bundle_copy, encoder=meta["reference_encoder"])
    msg = _error(bundle_copy)
    assert "float encoder" in msg and "full-integer" in msg


def test_encoder_output_does_not_match_rnn_input(bundle_copy: Path) -> None:
    # A step model trained for 32-value features, beside an encoder that gives another size.
    if load_bundle(bundle_copy).feature_size == 32:
        pytest.skip("the shipped encoder itself outputs 32 features")
    shutil.copy(DATA / "rnn_encoder_step_f32.tflite", bundle_copy / "rnn_encoder_step.tflite")
    msg = _error(bundle_copy)
    assert "rnn_encoder_step.tflite" in msg and "'feature' has 32 values" in msg


def test_feature_size_field_disagrees(bundle_copy: Path) -> None:
    b = load_bundle(bundle_copy)
    _edit(bundle_copy, feature_size=b.feature_size + 1)
    assert "'feature_size'" in _error(bundle_copy)


def test_path_leaving_bundle(bundle_copy: Path) -> None:
    shutil.copy(bundle_copy / "encoder.tflite", bundle_copy.parent / "outside.tflite")
    _edit(bundle_copy, encoder="../outside.tflite")
    assert "leaves the bundle directory" in _error(bundle_copy)


def test_unknown_schema_version(bundle_copy: Path) -> None:
    _edit(bundle_copy, schema_version=2)
    msg = _error(bundle_copy)
    assert "schema_version" in msg and "is 2" in msg


def test_vocab_size_does_not_match_logits(bundle_copy: Path) -> None:
    vocab = bundle_copy / "vocab.txt"
    vocab.write_text(vocab.read_text() + "extra\n")
    msg = _error(bundle_copy)
    assert "vocab.txt" in msg and "logits" in msg


def test_special_token_outside_vocab(bundle_copy: Path) -> None:
    _edit(bundle_copy, tokens__eos=10_000)
    assert "'tokens.eos'" in _error(bundle_copy)
