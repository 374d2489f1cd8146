"""Bundle validation branches test_bundle.py does not reach: each one line naming file and field.

Messages are matched on what they must name (the file, the field, the value
at fault), not on their wording, which the schema layer owns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest

from test_bundle import _error

from conftest import DATA
from edgecap.bundle import default_bundle, load_bundle

MULTI_OUTPUT_SOURCE = DATA / "compile" / "tiny_inception.tflite"


def _meta(bundle: Path) -> Dict[str, Any]:
    return json.loads((bundle / "bundle.json").read_text())


def _set(bundle: Path, dotted: str, value: Any) -> None:
    meta = _meta(bundle)
    node = meta
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node[p]
    if value is _DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    (bundle / "bundle.json").write_text(json.dumps(meta))


_DELETE = object()


@pytest.fixture(scope="module")
def split_model(tmp_path_factory) -> Path:
    """A model cut from tiny_inception inside a block: one input, two outputs, no signatures."""
    from edgecap_compile.graph import read_graph
    from edgecap_compile.segments import write_segments

    graph = read_graph(MULTI_OUTPUT_SOURCE)
    n = len(graph.ops)
    cut = next(k for k in range(1, n) if len(graph.segment_io(0, k)[1]) >= 2)
    first = write_segments(graph, [(0, cut), (cut, n)], tmp_path_factory.mktemp("split"))[0]
    return first.path


def test_default_bundle_follows_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EDGECAP_BUNDLE", str(tmp_path))
    assert default_bundle() == tmp_path
    monkeypatch.delenv("EDGECAP_BUNDLE")
    assert (default_bundle() / "bundle.json").is_file()


def test_bundle_json_itself_may_be_passed(shipped_bundle: Path) -> None:
    assert load_bundle(shipped_bundle / "bundle.json").root == shipped_bundle.resolve()


def test_optional_fields_take_their_defaults(bundle_copy: Path) -> None:
    for field in ("input.color_order", "reference_encoder", "name"):
        _set(bundle_copy, field, _DELETE)
    _set(bundle_copy, "window.sample_fps", 8)  # an integer where a float belongs is fine
    b = load_bundle(bundle_copy)
    assert b.input.color_order == "RGB"
    assert b.reference_encoder is None
    assert b.name == bundle_copy.resolve().name
    assert b.window.sample_fps == 8.0 and isinstance(b.window.sample_fps, float)


def test_json_that_is_not_an_object(bundle_copy: Path) -> None:
    (bundle_copy / "bundle.json").write_text("[1, 2, 3]")
    msg = _error(bundle_copy)
    assert "bundle.json" in msg and "object" in msg


@pytest.mark.parametrize("field,value", [
    ("window.frames", 0),
    ("window.stride", -2),
    ("input.height", 0),
    ("feature_size", -1),
    ("rnn.hidden_size", 0),
    ("max_caption_length", 0),
])
def test_sizes_must_be_positive(bundle_copy: Path, field: str, value: int) -> None:
    _set(bundle_copy, field, value)
    msg = _error(bundle_copy)
    assert "bundle.json" in msg and f"'{field}'" in msg


@pytest.mark.parametrize("field,value", [
    ("input.mean", [127.5, 127.5]),
    ("input.std", [127.5, 127.5, 127.5, 127.5]),
    ("input.mean", ["a", 127.5, 127.5]),
])
def test_normalisation_needs_one_number_per_channel(bundle_copy: Path, field: str, value: list) -> None:
    _set(bundle_copy, field, value)
    msg = _error(bundle_copy)
    assert "bundle.json" in msg and f"'{field}" in msg


def test_unknown_colour_order(bundle_copy: Path) -> None:
    _set(bundle_copy, "input.color_order", "GRB")
    msg = _error(bundle_copy)
    assert "bundle.json" in msg and "'input.color_order'" in msg and "GRB" in msg


def test_zero_std(bundle_copy: Path) -> None:
    _set(bundle_copy, "input.std", [127.5, 0, 127.5])
    msg = _error(bundle_copy)
    assert "bundle.json" in msg and "'input.std" in msg


def test_negative_sample_rate(bundle_copy: Path) -> None:
    _set(bundle_copy, "window.sample_fps", -8.0)
    msg = _error(bundle_copy)
    assert "bundle.json" in msg and "'window.sample_fps'" in msg


def test_vocabulary_that_is_not_utf8(bundle_copy: Path) -> None:
    (bundle_copy / "vocab.txt").write_bytes(b"<pad>\n\xff\xfe\n")
    msg = _error(bundle_copy)
    assert "vocab.txt" in msg and "UTF-8" in msg


def test_empty_vocabulary(bundle_copy: Path) -> None:
    (bundle_copy / "vocab.txt").write_text("")
    msg = _error(bundle_copy)
    assert "vocab.txt" in msg and "empty" in msg


def test_input_size_the_encoder_does_not_take(bundle_copy: Path) -> None:
    _set(bundle_copy, "input.height", 32)
    msg = _error(bundle_copy)
    assert "bundle.json" in msg and "'input'" in msg and "encoder.tflite" in msg and "32" in msg


def test_hidden_size_the_step_models_do_not_have(bundle_copy: Path) -> None:
    _set(bundle_copy, "rnn.hidden_size", 64)
    msg = _error(bundle_copy)
    assert "'rnn.hidden_size'" in msg and "64" in msg and "rnn_encoder_step.tflite" in msg


def test_encoder_with_two_outputs(bundle_copy: Path, split_model: Path) -> None:
    (bundle_copy / "encoder.tflite").write_bytes(split_model.read_bytes())
    msg = _error(bundle_copy)
    assert "encoder.tflite" in msg and "one input and one output" in msg and "has 1 and 2" in msg


def test_step_model_without_a_signature(bundle_copy: Path, split_model: Path) -> None:
    (bundle_copy / "rnn_encoder_step.tflite").write_bytes(split_model.read_bytes())
    msg = _error(bundle_copy)
    assert "rnn_encoder_step.tflite" in msg and "serving_default" in msg


def test_step_models_swapped(bundle_copy: Path) -> None:
    meta = _meta(bundle_copy)
    _set(bundle_copy, "rnn.decoder_step", meta["rnn"]["encoder_step"])
    msg = _error(bundle_copy)
    assert "rnn_encoder_step.tflite" in msg and "signature" in msg and "logits" in msg


def test_field_naming_a_directory(bundle_copy: Path) -> None:
    (bundle_copy / "sub").mkdir()
    _set(bundle_copy, "vocab", "sub")
    msg = _error(bundle_copy)
    assert "'vocab'" in msg and "sub" in msg
