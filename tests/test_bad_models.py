"""Bad .tflite files in a bundle are refused by load_bundle in one line, before an interpreter parses them.

Plan segments: tests/test_bad_plan.py. The verifier itself: tests/test_tflite_verify.py.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from edgecap import modelfile
from edgecap.bundle import load_bundle
from edgecap.errors import BundleError

TINY = Path(__file__).resolve().parent / "data" / "runtime" / "tiny_encoder.tflite"
MODELS = ["encoder.tflite", "rnn_encoder_step.tflite", "rnn_decoder_step.tflite"]


@pytest.fixture
def interpreters(monkeypatch) -> list:
    """The models an interpreter was made for, in order."""
    made: list = []
    real = modelfile.make_cpu_interpreter
    monkeypatch.setattr(modelfile, "make_cpu_interpreter", lambda m, *a, **k: made.append(m) or real(m, *a, **k))
    return made


def _refused(bundle: Path, match: str) -> str:
    with pytest.raises(BundleError, match=match) as err:
        load_bundle(bundle)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("name", MODELS + ["encoder_float.tflite"])
def test_a_truncated_model(bundle_copy: Path, interpreters: list, name: str) -> None:
    path = bundle_copy / name
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[: size // 2])
    _refused(bundle_copy, rf"{name}: corrupt or truncated TFLite model \(.*past the end.*\); re-export")
    # Models before it in load order were opened; the broken one never reached an interpreter.
    assert len(interpreters) == (MODELS.index(name) if name in MODELS else 1)


@pytest.mark.parametrize("name", MODELS)
def test_random_bytes_for_a_model(bundle_copy: Path, interpreters: list, name: str) -> None:
    (bundle_copy / name).write_bytes(os.urandom(5000))
    _refused(bundle_copy, rf"{name}: not a TFLite model \(no TFL3 identifier at bytes 4..8\); re-export it")
    assert len(interpreters) == MODELS.index(name)


def test_random_bytes_behind_the_identifier(bundle_copy: Path, interpreters: list) -> None:
    (bundle_copy / "encoder.tflite").write_bytes(b"\x10\x00\x00\x00TFL3" + os.urandom(5000))
    _refused(bundle_copy, r"encoder.tflite: corrupt or truncated TFLite model")
    assert interpreters == []


def test_a_corrupt_offset(bundle_copy: Path, interpreters: list) -> None:
    path = bundle_copy / "rnn_decoder_step.tflite"
    data = bytearray(path.read_bytes())
    data[0:4] = (len(data) + 64).to_bytes(4, "little")  # the root table past the end
    path.write_bytes(bytes(data))
    _refused(bundle_copy, r"rnn_decoder_step.tflite: corrupt or truncated TFLite model \(root offset")
    assert len(interpreters) == 2


@pytest.mark.parametrize("name, text", [
    ("encoder.tflite", b"serving_default_frame:0"),  # a tensor name
    ("rnn_decoder_step.tflite", b"serving_default"),  # a signature key
])
def test_a_string_that_is_not_utf8(bundle_copy: Path, interpreters: list, name: str, text: bytes) -> None:
    # Before the verifier read strings, such a name passed `validate` and crashed `caption`.
    path = bundle_copy / name
    data = bytearray(path.read_bytes())
    pos = data.find(text)
    assert pos > 0
    data[pos] = 0xFF
    path.write_bytes(bytes(data))
    _refused(bundle_copy, rf"{name}: corrupt or truncated TFLite model \(.*: not valid UTF-8")
    assert len(interpreters) == MODELS.index(name)


def test_a_float_encoder_where_int8_is_required(bundle_copy: Path) -> None:
    shutil.copy(bundle_copy / "encoder_float.tflite", bundle_copy / "encoder.tflite")
    _refused(bundle_copy, r"encoder.tflite: float encoder \(input float32, output float32\): export it "
                          r"with full-integer \(int8\) quantization")


@pytest.mark.parametrize("swap, match", [
    # Another int8 encoder: its input is not the bundle's frame size.
    (lambda b: shutil.copy(TINY, b / "encoder.tflite"),
     r"bundle.json: field 'input' says \[64, 64, 3\] but encoder.tflite takes \[1, 16, 16, 3\]"),
    # The RNN step models swapped for each other: their signatures give them away.
    (lambda b: shutil.copy(b / "rnn_decoder_step.tflite", b / "rnn_encoder_step.tflite"),
     r"rnn_encoder_step.tflite: signature has inputs \['c', 'h', 'word'\] and outputs "
     r"\['c_out', 'h_out', 'logits'\], expected \['c', 'feature', 'h'\]"),
    (lambda b: shutil.copy(b / "rnn_encoder_step.tflite", b / "rnn_decoder_step.tflite"),
     r"rnn_decoder_step.tflite: signature has inputs \['c', 'feature', 'h'\]"),
    # The encoder in the step model's place.
    (lambda b: shutil.copy(b / "encoder.tflite", b / "rnn_encoder_step.tflite"),
     r"rnn_encoder_step.tflite: no 'serving_default' signature|rnn_encoder_step.tflite: signature has"),
])
def test_a_model_swapped_for_another(bundle_copy: Path, swap, match: str) -> None:
    swap(bundle_copy)
    _refused(bundle_copy, match)
