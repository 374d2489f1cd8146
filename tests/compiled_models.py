"""Writes small models shaped as edgetpu_compiler writes them, for tests without its output.

A compiled model's operators are one ``edgetpu-custom-op`` (the compiled
graph, opaque to a CPU) from its inputs to its outputs, then any ops the
compiler left on the CPU. What edgecap reads of such a file (boundary tensor
names, shapes, types, quantization and custom op codes) is written here as in
Coral's files; the op's payload is not (only libedgetpu reads it). The real
files are in tests/data/coral/ (small) and, for slow tests, the
google-coral/test_data mirror.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence, Tuple

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

# (name, shape, dtype, scale, zero_point)
TensorDef = Tuple[str, Tuple[int, ...], str, float, int]
_TYPES = {"uint8": schema.TensorType.UINT8, "int8": schema.TensorType.INT8,
          "float32": schema.TensorType.FLOAT32}


def _tensor(t: TensorDef, buffer: int) -> schema.TensorT:
    name, shape, dtype, scale, zero_point = t
    out = schema.TensorT()
    out.name = name.encode()
    out.shape = np.array(shape, dtype=np.int32)
    out.type = _TYPES[dtype]
    out.buffer = buffer
    if dtype != "float32":
        q = schema.QuantizationParametersT()
        q.scale = [scale]
        q.zeroPoint = [zero_point]
        out.quantization = q
    return out


def write_compiled(path: Path, inputs: Sequence[TensorDef], outputs: Sequence[TensorDef],
                   payload: bytes = b"\0" * 64) -> Path:
    """Writes a model whose only TPU work is one ``edgetpu-custom-op``.

    A float32 output is written as Coral's last segments write one: the TPU
    op's uint8 result, then a DEQUANTIZE op the compiler left on the CPU.

    Args:
      path: Where to write it.
      inputs: The model's inputs.
      outputs: The model's outputs.
      payload: The custom op's options (stands in for the compiled executable).

    Returns:
      ``path``.
    """
    model = schema.ModelT()
    model.version = 3
    model.buffers = [schema.BufferT()]
    tpu = schema.OperatorCodeT()
    tpu.builtinCode = tpu.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    tpu.customCode = b"edgetpu-custom-op"
    dequantize = schema.OperatorCodeT()
    dequantize.builtinCode = dequantize.deprecatedBuiltinCode = schema.BuiltinOperator.DEQUANTIZE
    model.operatorCodes = [tpu, dequantize]
    tensors = [_tensor(t, 0) for t in (*inputs, *outputs)]
    ins = list(range(len(inputs)))
    outs = list(range(len(inputs), len(tensors)))
    tpu_outs, cpu_ops = [], []
    for index, t in zip(outs, outputs):
        if t[2] != "float32":
            tpu_outs.append(index)
            continue
        tpu_outs.append(len(tensors))
        tensors.append(_tensor((t[0] + "/quantized", t[1], "uint8", 0.1, 0), 0))
        cpu_ops.append(_op(1, [tpu_outs[-1]], [index]))
    tpu_op = _op(0, ins, tpu_outs)
    tpu_op.customOptions = np.frombuffer(payload, dtype=np.uint8)
    sub = schema.SubGraphT()
    sub.tensors, sub.inputs, sub.outputs, sub.operators = tensors, ins, outs, [tpu_op, *cpu_ops]
    model.subgraphs = [sub]
    path.write_bytes(bytes(flatbuffer_utils.convert_object_to_bytearray(model)))
    return path


def _op(code: int, inputs: Sequence[int], outputs: Sequence[int]) -> schema.OperatorT:
    op = schema.OperatorT()
    op.opcodeIndex = code
    op.inputs, op.outputs = np.array(inputs, dtype=np.int32), np.array(outputs, dtype=np.int32)
    return op
