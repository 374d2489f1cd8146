"""Graph reader: op list, work counts, live tensors across cuts, bad models."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

from edgecap_compile.cost_model import boundary_bytes
from edgecap_compile.errors import CompileError
from edgecap_compile.graph import read_graph

DATA = Path(__file__).parent / "data" / "compile"
FIXTURES = ["tiny_mobilenet", "tiny_inception", "tiny_densenet"]


def _pack(model: schema.ModelT) -> bytes:
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


@pytest.mark.parametrize("name", FIXTURES)
def test_reads_ops_in_order_with_their_work(name):
    graph = read_graph(DATA / f"{name}.tflite")
    assert graph.name == name and len(graph.sha256) == 64
    assert graph.ops and [op.index for op in graph.ops] == list(range(len(graph.ops)))
    for op in graph.ops:
        if op.type == "CONV_2D":
            out = graph.tensors[op.outputs[0]].shape
            _, kh, kw, cin = graph.tensors[op.inputs[1]].shape
            assert op.macs == int(np.prod(out)) * kh * kw * cin
            assert op.param_bytes == sum(graph.tensors[t].nbytes for t in op.inputs[1:])
        if op.type == "DEPTHWISE_CONV_2D":
            out = graph.tensors[op.outputs[0]].shape
            _, kh, kw, _ = graph.tensors[op.inputs[1]].shape
            assert op.macs == int(np.prod(out)) * kh * kw
        assert op.act_out_bytes == sum(graph.tensors[t].nbytes for t in op.outputs)
    # Every op's outputs come before their readers: execution order.
    for op in graph.ops:
        for t in op.inputs:
            assert graph.producer[t] < op.index


def test_branches_leave_several_tensors_live_across_a_cut():
    graph = read_graph(DATA / "tiny_inception.tflite")
    concat = next(op for op in graph.ops if op.type == "CONCATENATION")
    inputs, outputs = graph.segment_io(concat.index, len(graph.ops))
    assert len(inputs) == 4  # the four branches meet at the concat
    assert set(inputs) == set(graph.live_across(concat.index))
    assert outputs == list(graph.outputs)


def test_densenet_concat_chain_keeps_earlier_features_live():
    graph = read_graph(DATA / "tiny_densenet.tflite")
    widths = [len(graph.live_across(c)) for c in range(1, len(graph.ops))]
    assert max(widths) >= 2


@pytest.mark.parametrize("name", FIXTURES)
def test_boundary_bytes_match_segment_io_for_every_range(name):
    graph = read_graph(DATA / f"{name}.tflite")
    io = boundary_bytes(graph)
    n = len(graph.ops)
    for a in range(n + 1):
        for b in range(a + 1, n + 1):
            ins, outs = graph.segment_io(a, b)
            assert io[a, b] == sum(graph.tensors[t].nbytes for t in ins + outs), (a, b)


def test_float_model_asks_for_full_integer_quantization():
    with pytest.raises(CompileError, match="full-integer quantization") as e:
        read_graph(DATA / "tiny_float.tflite")
    assert "\n" not in str(e.value)


def test_more_than_one_subgraph_is_refused():
    model = flatbuffer_utils.read_model(str(DATA / "tiny_mobilenet.tflite"))
    model.subgraphs.append(model.subgraphs[0])
    with pytest.raises(CompileError, match="2 subgraphs"):
        read_graph(_pack(model))


@pytest.mark.parametrize("content", [b"", b"not a model at all", b"\0\0\0\0TFL3garbage"])
def test_unreadable_bytes_are_refused(content, tmp_path):
    path = tmp_path / "bad.tflite"
    path.write_bytes(content)
    with pytest.raises(CompileError, match="bad.tflite"):
        read_graph(path)


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(CompileError, match="cannot read model"):
        read_graph(tmp_path / "nope.tflite")


def test_unknown_op_gets_a_safe_default_and_a_warning(caplog):
    model = flatbuffer_utils.read_model(str(DATA / "tiny_mobilenet.tflite"))
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode = b"MysteryOp"
    model.operatorCodes.append(code)
    model.subgraphs[0].operators[3].opcodeIndex = len(model.operatorCodes) - 1
    with caplog.at_level(logging.WARNING, logger="edgecap_compile"):
        graph = read_graph(_pack(model))
    assert graph.unknown_ops == ("MysteryOp",)
    assert "MysteryOp" in caplog.text
    op = graph.ops[3]
    touched = sum(int(np.prod(graph.tensors[t].shape)) for t in op.inputs + op.outputs)
    assert op.type == "MysteryOp" and op.elements == touched
