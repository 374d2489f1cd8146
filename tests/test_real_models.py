"""Real models as they come (Coral's test_data): uint8 inputs, several inputs and outputs, an LSTM's
optional inputs, quantization intermediates and state, metadata after the flatbuffer, no buffers at
all, through the verifier, the child's first invoke, ``compile`` and its chain check."""

from __future__ import annotations

import io
import subprocess
import zipfile
from pathlib import Path

import pytest

from edgecap import trial_invoke
from edgecap.modelfile import open_model
from edgecap.tflite_verify import verify_tflite

pytest.importorskip("ai_edge_litert.schema_py_generated")
from edgecap_compile import compile_model  # noqa: E402
from edgecap_lab.compile_benchmark import chain_matches  # noqa: E402
from edgecap_compile.errors import CompileError  # noqa: E402
from edgecap_compile.graph import read_graph  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
REAL = REPO / "tests" / "data" / "real_models"
LSTM = REAL / "keras_lstm_mnist_ptq.tflite"
SPLIT = REAL / "split_concat.tflite"
MIRROR = Path("/work/.mirror/google-coral+test_data/repo")


@pytest.fixture(autouse=True)
def scratch_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_several_uint8_inputs_and_outputs_chain_bit_exact(tmp_path: Path) -> None:
    # Three uint8 inputs, five outputs: the chain check feeds each input its own type.
    graph = read_graph(SPLIT)
    assert len(graph.inputs) == 3 and len(graph.outputs) == 5
    assert {graph.tensors[i].dtype for i in graph.inputs} == {"uint8"}
    compile_model(SPLIT, "devboard-usb", tmp_path / "plan")
    assert chain_matches(SPLIT, tmp_path / "plan")


def test_an_lstm_with_intermediates_and_state_compiles_and_chains(tmp_path: Path) -> None:
    # Its quantization intermediates (shape [0], float32) are not a dynamic shape nor a float
    # activation, and its state tensors stay with the LSTM instead of becoming a segment's input.
    graph = read_graph(LSTM)
    assert any(op.type == "UNIDIRECTIONAL_SEQUENCE_LSTM" for op in graph.ops)
    compile_model(LSTM, "devboard-usb", tmp_path / "plan")
    assert chain_matches(LSTM, tmp_path / "plan")


def test_an_lstm_opens_where_a_bundle_model_opens() -> None:
    model, _ = open_model(LSTM)
    assert [t.dtype for t in model.inputs] == ["uint8"] and [t.dtype for t in model.outputs] == ["uint8"]


def test_metadata_appended_after_the_flatbuffer_is_accepted(tmp_path: Path) -> None:
    # TFLite Support metadata tools append a zip of associated files (labels) after the flatbuffer.
    blob = io.BytesIO()
    with zipfile.ZipFile(blob, "w") as z:
        z.writestr("labels.txt", "a\nb\n")
    model = tmp_path / "with_metadata.tflite"
    model.write_bytes(SPLIT.read_bytes() + blob.getvalue())
    verify_tflite(model.read_bytes(), str(model))
    assert trial_invoke.check(model.read_bytes(), model).kind == "ok"
    compile_model(model, "devboard-usb", tmp_path / "plan")
    assert chain_matches(model, tmp_path / "plan")


def _mirror_models():
    if not MIRROR.exists():
        return []
    listing = subprocess.run(["git", "-C", str(MIRROR), "ls-tree", "-r", "-l", "HEAD"],
                             capture_output=True, text=True).stdout
    return [line.split()[4] for line in listing.splitlines()
            if line.split()[4].endswith(".tflite") and line.split()[3] not in ("-", "BAD")]


@pytest.mark.slow
@pytest.mark.skipif(not MIRROR.exists(), reason="no google-coral/test_data mirror")
@pytest.mark.parametrize("name", _mirror_models())
def test_every_real_coral_model_is_accepted_and_never_crashes(name: str, tmp_path: Path) -> None:
    data = subprocess.run(["git", "-C", str(MIRROR), "show", f"HEAD:{name}"], capture_output=True).stdout
    path = tmp_path / Path(name).name
    path.write_bytes(data)
    verify_tflite(data, name)
    outcome = trial_invoke.check(data, path)
    # EdgeTPU-compiled files and custom ops cannot run on a CPU: an error, never a crash.
    assert outcome.kind == "ok" or (outcome.kind == "error" and "custom op" in outcome.detail), outcome


def test_a_model_the_interpreter_refuses_is_named_so_not_corrupt(tmp_path: Path, capsys) -> None:
    import shutil

    from ai_edge_litert import schema_py_generated as schema

    from edgecap.cli import main

    data = bytearray(SPLIT.read_bytes())
    model = schema.Model.GetRootAsModel(data, 0)
    graph = model.Subgraphs(0)
    codes = [model.OperatorCodes(graph.Operators(i).OpcodeIndex()) for i in range(graph.OperatorsLength())]
    concat = next(graph.Operators(i) for i, c in enumerate(codes)
                  if max(c.BuiltinCode(), c.DeprecatedBuiltinCode()) == schema.BuiltinOperator.CONCATENATION)
    out = graph.Tensors(int(concat.OutputsAsNumpy()[0]))
    data[out._tab.Pos + out._tab.Offset(6)] = schema.TensorType.COMPLEX128  # Tensor.type
    bundle = tmp_path / "bundle"
    shutil.copytree(REPO / "models" / "demo" / "bundle", bundle)
    (bundle / "encoder.tflite").write_bytes(bytes(data))
    assert main(["validate", str(bundle)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the TFLite interpreter refused the model (" in err, err
    assert "CONCATENATION" in err and "corrupt" not in err


def test_the_chain_checks_inputs_take_each_tensors_own_type() -> None:
    import numpy as np

    from edgecap_lab.compile_benchmark import random_input
    from edgecap_compile.graph import Tensor

    rng = np.random.default_rng(0)
    for dtype in ("uint8", "int8", "int16", "float32", "bool"):
        t = Tensor(0, "x", (1, 4, 4, 3), dtype, None, None, 48, False)
        x = random_input(rng, t)
        assert x.dtype == np.dtype(dtype) and x.shape == (1, 4, 4, 3)
    wide = random_input(rng, Tensor(0, "x", (4096,), "uint8", None, None, 4096, False))
    assert wide.min() < 16 and wide.max() > 240  # the whole range, not int8's half of it


def test_compile_names_the_custom_op_where_the_schema_reader_trips() -> None:
    # The schema reader raised a bare IndexError on this model with no buffers
    # ("index 0 is out of bounds"); the real reason is its unresolvable custom op.
    with pytest.raises(CompileError, match=r"has custom operators \(fake-op-double\) that edgecap compile "
                                           r"cannot read, price or split") as caught:
        read_graph(REAL / "model_invoking_error.tflite")
    assert "out of bounds" not in str(caught.value)
