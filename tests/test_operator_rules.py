"""The operator check (edgecap.operator_rules through edgecap.tflite_verify): each builtin
operator's inputs and outputs as its kernel needs them, refused in one line before any interpreter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgecap import operator_rules
from edgecap.cli import main
from edgecap.errors import BundleError
from edgecap.tflite_verify import verify_tflite

schema = pytest.importorskip("ai_edge_litert.schema_py_generated")

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "models" / "demo" / "bundle"
REAL = REPO / "tests" / "data" / "real_models"


# Byte positions found with the schema's own reader (ai-edge-litert's generated
# bindings), not with the verifier under test.
def _ops(data: bytes):
    model = schema.Model.GetRootAsModel(data, 0)
    graph = model.Subgraphs(0)
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        code = model.OperatorCodes(op.OpcodeIndex())
        yield i, max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), op


def _io_pos(op, which: str, position: int) -> int:
    """Byte position of an operator's input or output index (Operator.inputs: field 1, outputs: field 2)."""
    slot = {"inputs": 6, "outputs": 8}[which]
    return op._tab.Vector(op._tab.Offset(slot)) + 4 * position


def _first(data: bytes, code: int):
    return next(op for _, c, op in _ops(data) if c == code)


def _set_index(data: bytes, code: int, which: str, position: int, value: int) -> bytes:
    out = bytearray(data)
    pos = _io_pos(_first(data, code), which, position)
    out[pos:pos + 4] = value.to_bytes(4, "little", signed=True)
    return bytes(out)


def _tensor_index(data: bytes, code: int, which: str, position: int) -> int:
    op = _first(data, code)
    return int((op.InputsAsNumpy() if which == "inputs" else op.OutputsAsNumpy())[position])


def _refused(data: bytes) -> str:
    with pytest.raises(BundleError) as info:
        verify_tflite(data, "m.tflite")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("m.tflite: TFLite model its kernels cannot run ("), msg
    return msg


CONV = schema.BuiltinOperator.CONV_2D


def test_a_conv_filter_left_out_is_refused_in_one_line() -> None:
    # The issue's crash: one 4-byte change, CONV_2D's filter index set to -1.
    data = _set_index((DEMO / "encoder.tflite").read_bytes(), CONV, "inputs", 1, -1)
    msg = _refused(data)
    assert "operators[0].CONV_2D's input 1 is -1 (left out); none may be left out" in msg


def test_validate_of_the_issues_crash_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(DEMO, bundle)
    enc = bundle / "encoder.tflite"
    enc.write_bytes(_set_index(enc.read_bytes(), CONV, "inputs", 1, -1))
    assert main(["validate", str(bundle)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CONV_2D's input 1 is -1" in err and "Traceback" not in err


def test_an_optional_input_left_out_passes_where_the_operator_allows_it() -> None:
    # FULLY_CONNECTED without bias (the demo's RNN steps) and the LSTM's optional
    # peephole and projection inputs (Coral's keras LSTM).
    for path in (DEMO / "rnn_encoder_step.tflite", REAL / "keras_lstm_mnist_ptq.tflite"):
        data = path.read_bytes()
        assert any(-1 in list(op.InputsAsNumpy()) for _, _, op in _ops(data))
        verify_tflite(data, str(path))


def test_an_output_left_out_is_refused() -> None:
    data = _set_index((DEMO / "encoder.tflite").read_bytes(), CONV, "outputs", 0, -1)
    assert "CONV_2D's output 0 is -1 (left out)" in _refused(data)


def test_a_filter_of_the_wrong_rank_is_refused() -> None:
    data = (DEMO / "encoder.tflite").read_bytes()
    bias = _tensor_index(data, CONV, "inputs", 2)
    msg = _refused(_set_index(data, CONV, "inputs", 1, bias))
    assert f"CONV_2D's input 1 (tensor {bias}) has rank 1; its kernel needs rank 4" in msg


def test_an_index_of_the_wrong_type_is_refused() -> None:
    # SPLIT's first input is the axis, an int32 scalar: point it at the float data.
    data = (REAL / "split_concat.tflite").read_bytes()
    split = schema.BuiltinOperator.SPLIT
    other = _tensor_index(data, split, "inputs", 1)
    msg = _refused(_set_index(data, split, "inputs", 0, other))
    assert f"SPLIT's input 0 (tensor {other})" in msg and "its kernel needs" in msg


def test_a_wrong_input_count_is_named() -> None:
    problem = operator_rules.check_operator(CONV, [0], [1], [((1, 2, 2, 1), "int8")] * 2)
    assert problem == "CONV_2D has 1 inputs; its kernel takes 2 to 3"


def test_a_negative_or_huge_shape_is_refused() -> None:
    assert "negative dimension" in operator_rules.check_tensor((1, -1, 3), 1)
    assert "over the" in operator_rules.check_tensor((1 << 20, 1 << 20, 8), 1)
    assert operator_rules.check_tensor((1, 224, 224, 3), 1) is None


def test_a_model_with_no_buffers_naming_buffer_0_passes() -> None:
    # TFLite loads it (buffer 0 is the schema's empty sentinel); it fails later, at its custom op.
    verify_tflite((REAL / "model_invoking_error.tflite").read_bytes(), "model_invoking_error.tflite")


@pytest.mark.parametrize("path", sorted(REAL.glob("*.tflite")), ids=lambda p: p.name)
def test_every_real_fixture_passes(path: Path) -> None:
    verify_tflite(path.read_bytes(), str(path))


def test_the_table_names_each_operator_by_the_schemas_code() -> None:
    table = operator_rules.load_table()
    for name, rule in table.operators.items():
        assert getattr(schema.BuiltinOperator, name) == rule.code, name
        assert not rule.optional or max(rule.optional) < (rule.inputs[1] or 1 << 30), name
    raw = json.loads(operator_rules.TABLE.read_text())
    assert "Sources" in raw["about"]


def test_custom_and_unlisted_operators_pass_the_table() -> None:
    assert operator_rules.check_operator(schema.BuiltinOperator.CUSTOM, [-1], [-1], []) is None


def test_a_zero_point_outside_its_types_range_is_refused() -> None:
    # The fuzzer's find: Coral's LSTM with an int8 zero point of 128 segfaults the interpreter.
    data = bytearray((REAL / "keras_lstm_mnist_ptq.tflite").read_bytes())
    model = schema.Model.GetRootAsModel(data, 0)
    tensors = model.Subgraphs(0)
    for i in range(tensors.TensorsLength()):
        t = tensors.Tensors(i)
        q = t.Quantization()
        if t.Type() == schema.TensorType.INT8 and q is not None and q.ZeroPointLength():
            start = q._tab.Vector(q._tab.Offset(10))  # QuantizationParameters.zero_point
            data[start:start + 8] = (128).to_bytes(8, "little", signed=True)
            break
    assert "quantization.zero_point: 128 is outside int8's range -128..127" in _refused(bytes(data))


def test_a_custom_name_beside_a_builtin_code_is_not_a_custom_op() -> None:
    # TFLite reads custom_code only for the CUSTOM code: an edgetpu-custom-op name beside a builtin
    # code is that builtin, which the CPU would run, so the model is not "compiled" (left un-invoked).
    data = bytearray((REPO / "tests" / "data" / "coral" / "split_concat_edgetpu.tflite").read_bytes())
    assert verify_tflite(bytes(data), "m.tflite").edgetpu_compiled
    code = schema.Model.GetRootAsModel(data, 0).OperatorCodes(0)
    unlisted = schema.BuiltinOperator.HASHTABLE_LOOKUP  # a builtin the operator table does not check
    for slot in (4, 10):  # deprecated_builtin_code, builtin_code
        o = code._tab.Offset(slot)
        if o:
            data[code._tab.Pos + o] = unlisted
    info = verify_tflite(bytes(data), "m.tflite")
    assert not info.edgetpu_compiled and info.custom_ops == ()


def test_a_custom_name_beside_a_listed_builtin_code_is_checked_as_that_builtin() -> None:
    data = bytearray((REPO / "tests" / "data" / "coral" / "split_concat_edgetpu.tflite").read_bytes())
    code = schema.Model.GetRootAsModel(data, 0).OperatorCodes(0)
    data[code._tab.Pos + code._tab.Offset(4)] = schema.BuiltinOperator.FULLY_CONNECTED
    assert "operators[0].FULLY_CONNECTED has 5 outputs; its kernel takes 1 to 2" in _refused(bytes(data))


def test_an_intermediate_left_out_is_refused() -> None:
    # The fuzzer's find: an LSTM intermediate set to -1 read garbage, crashing TFLite only sometimes
    # (so a child's first invoke could pass it).
    data = bytearray((REAL / "keras_lstm_mnist_ptq.tflite").read_bytes())
    op = _first(bytes(data), schema.BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_LSTM)
    pos = op._tab.Vector(op._tab.Offset(20)) + 4 * 4  # Operator.intermediates[4]
    data[pos:pos + 4] = (-1).to_bytes(4, "little", signed=True)
    with pytest.raises(BundleError, match=r"operators\[1\]\.intermediates: index -1 out of range"):
        verify_tflite(bytes(data), "m.tflite")
