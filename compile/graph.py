"""The graph reader: a TFLite model as an op list in execution order, with the work of each op.

Reads the flatbuffer with the schema object API that ai-edge-litert ships
(``schema_py_generated``, ``tools.flatbuffer_utils``); the segment writer builds
its segments from the same ``ModelT``.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Set, Tuple, Union

import numpy as np
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.tools import flatbuffer_utils

from edgecap import files
from edgecap.tflite_verify import verify_tflite
from edgecap_compile.errors import CompileError
from edgecap_compile.op_work import OpShapes, op_work

_log = logging.getLogger("edgecap_compile")

_TYPE_NAMES = {
    value: name.lower() for name, value in vars(schema.TensorType).items() if name.isupper()
}
_BUILTIN_NAMES = {
    value: name for name, value in vars(schema.BuiltinOperator).items() if name.isupper()
}
# What edgetpu_compiler's output runs in: a model holding it is compiled already.
_EDGETPU_CUSTOM_OP = "edgetpu-custom-op"
_INTEGER_ACTIVATIONS = {"int8", "uint8", "int16", "int32", "int64", "bool"}


@dataclass(frozen=True)
class Tensor:
    """One tensor of the model.

    Attributes:
      index: Index in the subgraph's tensor list.
      name: Name in the source model (boundary tensors keep it in every segment).
      shape: Static shape.
      dtype: numpy-style type name, e.g. ``int8``.
      scale: Quantization scale (the first one for per-channel tensors), or None.
      zero_point: Quantization zero point, or None.
      nbytes: Size in bytes.
      constant: Whether the model stores its value (a parameter) or the tensor is a
        variable (state its op keeps; it stays in the op's segment).
    """

    index: int
    name: str
    shape: Tuple[int, ...]
    dtype: str
    scale: Optional[float]
    zero_point: Optional[int]
    nbytes: int
    constant: bool


@dataclass(frozen=True)
class Op:
    """One operator, in execution order.

    Attributes:
      index: Position in the execution order.
      type: Builtin name (``CONV_2D``) or the custom op's code.
      inputs: Tensor indices it reads (constants included, omitted optionals dropped).
      outputs: Tensor indices it writes.
      macs: Multiply-accumulates.
      elements: Element work (pooling, element-wise, data movement).
      param_bytes: Bytes of the constant tensors it reads (a constant two ops share
        counts for both: segments store their own copy).
      act_in_bytes: Bytes of the activations it reads.
      act_out_bytes: Bytes of the activations it writes.
    """

    index: int
    type: str
    inputs: Tuple[int, ...]
    outputs: Tuple[int, ...]
    macs: int
    elements: int
    param_bytes: int
    act_in_bytes: int
    act_out_bytes: int


@dataclass
class Graph:
    """A single-subgraph TFLite model read for partitioning.

    Attributes:
      name: File stem, used to name segments.
      sha256: Hex digest of the model file.
      model: The schema object tree (``ModelT``) the segment writer copies from.
      tensors: Every tensor, by index.
      ops: Every operator, in execution order.
      inputs: Tensor indices of the model inputs.
      outputs: Tensor indices of the model outputs.
      unknown_ops: Op types that had no cost rule (charged a safe default).
      producer: ``producer[t]``: the op writing tensor t (-1: model input or constant).
      last_use: ``last_use[t]``: the last op reading t (``len(ops)`` when the model
        outputs it, -1 when nothing reads it).
    """

    name: str
    sha256: str
    model: schema.ModelT
    tensors: List[Tensor]
    ops: List[Op]
    inputs: Tuple[int, ...]
    outputs: Tuple[int, ...]
    unknown_ops: Tuple[str, ...] = ()
    producer: np.ndarray = field(init=False, repr=False)
    last_use: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.ops)
        self.producer = np.full(len(self.tensors), -1, dtype=np.int64)
        self.last_use = np.full(len(self.tensors), -1, dtype=np.int64)
        for op in self.ops:
            self.producer[list(op.outputs)] = op.index
            self.last_use[list(op.inputs)] = op.index
        self.last_use[list(self.outputs)] = n

    def activations(self) -> List[int]:
        """Returns the indices of the non-constant tensors."""
        return [t.index for t in self.tensors if not t.constant]

    def live_across(self, cut: int) -> List[int]:
        """Returns the activations written before op ``cut`` (or fed to the model) that ops
        from ``cut`` on read or the model outputs, in ascending order."""
        return [t.index for t in self.tensors
                if not t.constant and self.producer[t.index] < cut <= self.last_use[t.index]]

    def segment_io(self, start: int, end: int) -> Tuple[List[int], List[int]]:
        """Returns the activations a contiguous op range reads from outside and writes for later.

        Args:
          start: First op of the range.
          end: One past the last op.

        Returns:
          ``(inputs, outputs)``: tensor indices in ascending order. Inputs are
          read in the range and come from earlier ops or the model input;
          outputs are written in the range and read after it or are model outputs.
        """
        ops = self.ops[start:end]
        written = {t for op in ops for t in op.outputs}
        read = {t for op in ops for t in op.inputs if not self.tensors[t].constant}
        inputs = sorted(read - written)
        outputs = sorted(t for t in written if self.last_use[t] >= end)
        return inputs, outputs


def _seq(vector):
    """A flatbuffer vector of the schema's object API, or () for an absent one: ai-edge-litert
    2.1 (the last for Python 3.9) gives numpy arrays, whose truth `x or ()` cannot take."""
    return () if vector is None else vector


def _shape(tensor: schema.TensorT) -> Tuple[int, ...]:
    return tuple(int(d) for d in (tensor.shape if tensor.shape is not None else ()))


def _custom_code(code: schema.OperatorCodeT) -> str:
    name = code.customCode
    return name.decode(errors="replace") if isinstance(name, bytes) else (name or "")


def _op_type(model: schema.ModelT, code_index: int) -> str:
    code = model.operatorCodes[code_index]
    builtin = flatbuffer_utils.get_builtin_code_from_operator_code(code)
    if builtin == schema.BuiltinOperator.CUSTOM and code.customCode:
        return code.customCode.decode("utf-8", "replace")
    return _BUILTIN_NAMES.get(builtin, f"BUILTIN_{builtin}")


def _tensor(model: schema.ModelT, index: int, tensor: schema.TensorT) -> Tensor:
    dtype = _TYPE_NAMES.get(tensor.type, f"type{tensor.type}")
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:
        itemsize = 4  # Exotic types (resource, variant, int4): a word is a safe guess.
    shape = _shape(tensor)
    buffer = model.buffers[tensor.buffer] if tensor.buffer else None
    stored = buffer is not None and buffer.data is not None and len(buffer.data) > 0
    # A variable (an LSTM's state) is kept by its op between invokes: it travels
    # with the op's segment like a parameter, never across a cut.
    constant = stored or bool(tensor.isVariable)
    quant = tensor.quantization
    scale = zero_point = None
    if quant is not None and quant.scale is not None and len(quant.scale):
        scale = float(quant.scale[0])
        zero_point = int(quant.zeroPoint[0]) if quant.zeroPoint is not None else 0
    name = tensor.name.decode("utf-8", "replace") if tensor.name else f"tensor_{index}"
    nbytes = len(buffer.data) if stored else int(np.prod(shape, dtype=np.int64)) * itemsize
    return Tensor(index, name, shape, dtype, scale, zero_point, nbytes, constant)


def _load(source: Union[str, os.PathLike, bytes]) -> Tuple[bytes, str]:
    if isinstance(source, (bytes, bytearray)):
        return bytes(source), "model"
    path = Path(source)
    try:
        data = files.read_regular(path, "model")[0]
    except OSError as e:
        raise CompileError(f"cannot read model {path}: {e.strerror or e}") from None
    return data, path.stem


def _unreadable(data: bytes, label: str, exc: Exception) -> str:
    """The line for a model ai-edge-litert's schema reader cannot read: the verifier's reason first.

    The reader raises whatever a buffer trips (an IndexError on a model with no
    buffers, which TFLite itself loads), so the verifier, which names what is
    wrong, speaks first; a file it accepts is named for what it holds that
    edgecap compile cannot split.
    """
    info = verify_tflite(bytes(data), label, error=CompileError,
                         fix="pass the model's source, or re-export it")
    custom = [op for op in info.custom_ops if op]
    if custom:
        return (f"{label} has custom operators ({', '.join(sorted(set(custom)))}) that edgecap "
                "compile cannot read, price or split; compile a model of builtin operators")
    return (f"{label} is a TFLite model the compiler's schema reader (ai-edge-litert "
            f"flatbuffer_utils) cannot read ({type(exc).__name__}: {exc}); re-export it")


def _read_model(data: bytes, label: str, first_subgraph_only: bool) -> "schema.ModelT":
    """Parses the flatbuffer and checks it is one (main) subgraph that edgetpu_compiler has not compiled."""
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise CompileError(f"{label} is not a TFLite flatbuffer (no TFL3 identifier)")
    try:
        model = flatbuffer_utils.read_model_from_bytearray(bytearray(data))
    except Exception as e:  # The generated reader raises whatever a corrupt buffer trips.
        raise CompileError(_unreadable(data, label, e)) from None
    if not model.subgraphs or (len(model.subgraphs) > 1 and not first_subgraph_only):
        raise CompileError(
            f"{label} has {len(model.subgraphs or [])} subgraphs; edgecap compile takes "
            "single-subgraph models (export without control flow or extra signatures)"
        )
    if any(_custom_code(c) == _EDGETPU_CUSTOM_OP for c in model.operatorCodes or []):
        raise CompileError(
            f"{label} is already compiled by edgetpu_compiler (edgetpu-custom-op); edgecap compile "
            "splits a model before compiling it: pass the model edgetpu_compiler was given, or import "
            "Coral's own segments with `edgecap plan import`")
    return model


def _check_static_shapes(label: str, tensors: List[Tensor], intermediates: Set[int]) -> None:
    """Refuses a model whose activations have a dynamic dimension."""
    for t in tensors:
        if not t.constant and t.index not in intermediates and any(d < 1 for d in t.shape) and t.shape:
            raise CompileError(
                f"{label}: tensor '{t.name}' has dynamic shape {list(t.shape)}; "
                "export with a fixed input shape and batch size 1"
            )


def _check_integer(label: str, tensors: List[Tensor], inputs: Tuple[int, ...], outputs: Tuple[int, ...],
                   intermediates: Set[int]) -> None:
    """Refuses a model the EdgeTPU cannot run: float inputs, outputs or activations."""
    for t in (tensors[i] for i in inputs + outputs):
        if t.dtype not in ("int8", "uint8"):
            raise CompileError(
                f"{label}: {'input' if t.index in inputs else 'output'} '{t.name}' is "
                f"{t.dtype}; the EdgeTPU needs full-integer quantization (int8 input "
                "and output, representative dataset)"
            )
    for t in tensors:
        if not t.constant and t.index not in intermediates and t.dtype not in _INTEGER_ACTIVATIONS:
            raise CompileError(
                f"{label}: activation '{t.name}' is {t.dtype}; the EdgeTPU needs "
                "full-integer quantization (every op int8)"
            )


def _op(model: "schema.ModelT", index: int, op: "schema.OperatorT", tensors: List[Tensor]) -> Tuple[Op, bool]:
    """Returns one operator as an ``Op`` with its work, and whether a cost rule knows its type."""
    op_type = _op_type(model, op.opcodeIndex)
    ins = tuple(int(i) for i in _seq(op.inputs) if i >= 0)
    outs = tuple(int(i) for i in _seq(op.outputs) if i >= 0)
    shapes = OpShapes(
        inputs=[tensors[i].shape if i >= 0 else None for i in _seq(op.inputs)],
        outputs=[tensors[i].shape for i in outs],
        options=op.builtinOptions,
    )
    work = op_work(op_type, shapes)
    return Op(
        index=index,
        type=op_type,
        inputs=ins,
        outputs=outs,
        macs=work.macs,
        elements=work.elements,
        param_bytes=sum(tensors[i].nbytes for i in ins if tensors[i].constant),
        act_in_bytes=sum(tensors[i].nbytes for i in ins if not tensors[i].constant),
        act_out_bytes=sum(tensors[i].nbytes for i in outs),
    ), work.known


def read_graph(
    source: Union[str, os.PathLike, bytes], require_integer: bool = True,
    first_subgraph_only: bool = False,
) -> Graph:
    """Reads a TFLite model into a ``Graph``.

    Args:
      source: Path to a .tflite file, or its bytes.
      require_integer: Reject models with float activations (the EdgeTPU runs
        full-integer models only); the RNN step models are read with False.
      first_subgraph_only: Read the main subgraph and ignore the others (an RNN
        step's variable initialisers) instead of refusing the model.

    Returns:
      The graph, ops in the model's execution order.

    Raises:
      CompileError: If the file cannot be read, is not a TFLite model, has more
        than one subgraph, has dynamic shapes, or is not full-integer when required.
    """
    data, stem = _load(source)
    label = os.fspath(source) if not isinstance(source, (bytes, bytearray)) else "model bytes"
    model = _read_model(data, label, first_subgraph_only)
    sub = model.subgraphs[0]
    tensors = [_tensor(model, i, t) for i, t in enumerate(sub.tensors or [])]
    inputs, outputs = tuple(_seq(sub.inputs)), tuple(_seq(sub.outputs))
    # An LSTM's quantization intermediates carry only scales (shape [0] or []), never data.
    intermediates = {int(i) for op in sub.operators or [] for i in _seq(op.intermediates)}
    _check_static_shapes(label, tensors, intermediates)
    if require_integer:
        _check_integer(label, tensors, inputs, outputs, intermediates)
    ops, unknown = [], set()
    for index, op in enumerate(sub.operators or []):
        one, known = _op(model, index, op, tensors)
        ops.append(one)
        if not known:
            unknown.add(one.type)
    if unknown:
        _log.warning(
            "%s: no cost rule for %s; charged as element work on every value read and "
            "written (the EdgeTPU may not run them either)", label, ", ".join(sorted(unknown))
        )
    digest = hashlib.sha256(data).hexdigest()
    return Graph(stem, digest, model, tensors, ops, inputs, outputs, tuple(sorted(unknown)))
