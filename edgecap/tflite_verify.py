"""Checks a .tflite file's flatbuffer before any interpreter parses it.

Some interpreters do not verify what they load (ai-edge-litert 1.4.0 and
tflite_runtime segfault on a truncated file), so edgecap walks the file
first: every offset, vtable, vector and string of the tables the interpreter
reads (Model, OperatorCode, SubGraph, Tensor, Operator, Buffer, Metadata,
SignatureDef) must lie inside the file, and the indices between them must be
in range. Option tables (operator unions) and other nested tables are checked
as tables (header, vtable and size inside the file), not field by field.
Pure Python, no schema bindings: it runs where only tflite_runtime is installed.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple, Type

from edgecap import operator_rules
from edgecap.errors import BundleError, EdgecapError

IDENTIFIER = b"TFL3"
# The custom op edgetpu_compiler puts in a compiled model: only libedgetpu's delegate runs it.
EDGETPU_CUSTOM_OP = "edgetpu-custom-op"

# Model, SubGraph, Tensor, ... field slots, as numbered in tensorflow/lite/schema/schema.fbs.
_MODEL_OPCODES, _MODEL_SUBGRAPHS, _MODEL_DESCRIPTION, _MODEL_BUFFERS = 1, 2, 3, 4
_MODEL_METADATA_BUFFER, _MODEL_METADATA, _MODEL_SIGNATURES = 5, 6, 7
_MODEL_EXTERNAL_GROUPS, _MODEL_EXTERNAL_BUFFERS = 8, 9
_SUBGRAPH_TENSORS, _SUBGRAPH_INPUTS, _SUBGRAPH_OUTPUTS, _SUBGRAPH_OPERATORS, _SUBGRAPH_NAME = 0, 1, 2, 3, 4
_TENSOR_SHAPE, _TENSOR_TYPE, _TENSOR_BUFFER, _TENSOR_NAME, _TENSOR_QUANT = 0, 1, 2, 3, 4
_TENSOR_SPARSITY, _TENSOR_SHAPE_SIGNATURE, _TENSOR_VARIANTS, _TENSOR_EXTERNAL = 6, 7, 9, 10
_OP_OPCODE, _OP_INPUTS, _OP_OUTPUTS, _OP_OPTIONS_TYPE, _OP_OPTIONS = 0, 1, 2, 3, 4
_OP_CUSTOM_OPTIONS, _OP_MUTATING, _OP_INTERMEDIATES = 5, 7, 8
_OP_LARGE_OFFSET, _OP_LARGE_SIZE, _OP_OPTIONS2_TYPE, _OP_OPTIONS2 = 9, 10, 11, 12
_OPCODE_DEPRECATED_BUILTIN, _OPCODE_CUSTOM, _OPCODE_BUILTIN = 0, 1, 3
_BUILTIN_CUSTOM = 32  # BuiltinOperator.CUSTOM
_BUFFER_DATA, _BUFFER_OFFSET, _BUFFER_SIZE = 0, 1, 2
_QUANT_MIN, _QUANT_MAX, _QUANT_SCALE, _QUANT_ZERO_POINT, _QUANT_DETAILS = 0, 1, 2, 3, 5
_METADATA_NAME, _METADATA_BUFFER = 0, 1
_SIGNATURE_INPUTS, _SIGNATURE_OUTPUTS, _SIGNATURE_KEY, _SIGNATURE_SUBGRAPH = 0, 1, 2, 4
_TENSORMAP_NAME, _TENSORMAP_INDEX = 0, 1

# Bytes per element of the TensorTypes whose constant data has a fixed size
# (strings, resources, variants and packed 2/4-bit types have none).
_ITEMSIZE = {0: 4, 1: 2, 2: 4, 3: 1, 4: 8, 6: 1, 7: 2, 8: 8, 9: 1, 10: 8, 11: 16,
             12: 8, 15: 4, 16: 2, 18: 2, 21: 1, 22: 1}


# TensorType -> numpy dtype name, as interpreters report a tensor's dtype.
_DTYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 5: "object", 6: "bool",
           7: "int16", 8: "complex64", 9: "int8", 10: "float64", 11: "complex128", 12: "uint64",
           15: "uint32", 16: "uint16"}


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as the flatbuffer declares it (name, shape, numpy dtype name)."""

    name: str
    shape: Tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class ModelInfo:
    """The main subgraph's boundary, as the flatbuffer declares it, and its custom op codes."""

    inputs: Tuple[TensorInfo, ...]
    outputs: Tuple[TensorInfo, ...]
    custom_ops: Tuple[str, ...] = ()

    @property
    def edgetpu_compiled(self) -> bool:
        """True when edgetpu_compiler compiled the model: it runs only through libedgetpu."""
        return EDGETPU_CUSTOM_OP in self.custom_ops


class _Corrupt(Exception):
    """What is wrong, without the file name (added once, at the top)."""

    kind = "corrupt or truncated TFLite model"


class _Invalid(_Corrupt):
    """A whole flatbuffer whose operators or tensors no kernel would take (``edgecap.operator_rules``)."""

    kind = "TFLite model its kernels cannot run"


_U32 = struct.Struct("<I").unpack_from
_I32 = struct.Struct("<i").unpack_from
_U16X2 = struct.Struct("<HH").unpack_from
_SCALARS = {fmt: struct.Struct(fmt) for fmt in ("<B", "<b", "<I", "<i", "<Q")}


@functools.lru_cache(maxsize=256)
def _array(code: str, n: int) -> Callable[..., Tuple[int, ...]]:
    """An unpacker of ``n`` little-endian ``code`` values (cached: the same lengths recur)."""
    return struct.Struct(f"<{n}{code}").unpack_from


@dataclass(frozen=True)
class _Table:
    pos: int
    size: int
    slots: Tuple[int, ...]  # each field's offset in the table, 0 where absent


class _Walker:
    """Bounds-checked reads of one flatbuffer; a read that would run past the end raises ``_Corrupt``."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.n = len(data)

    def table(self, pos: int, what: str) -> _Table:
        n = self.n
        if pos % 4 or pos + 4 > n:
            raise _Corrupt(f"{what}: table at byte {pos} is misaligned or past the end of the {n}-byte file")
        vtable = pos - _I32(self.data, pos)[0]
        if vtable % 2 or vtable < 0 or vtable + 4 > n:
            raise _Corrupt(f"{what}: vtable at byte {vtable} is misaligned or outside the {n}-byte file")
        vsize, size = _U16X2(self.data, vtable)
        if vsize < 4 or vsize % 2 or vtable + vsize > n:
            raise _Corrupt(f"{what}: vtable of {vsize} bytes at byte {vtable} does not fit the file")
        if size < 4 or pos + size > n:
            raise _Corrupt(f"{what}: table of {size} bytes at byte {pos} runs past the end of the file")
        slots = _array("H", (vsize - 4) // 2)(self.data, vtable + 4)
        # Fields this walk does not read must lie inside the table too: the
        # interpreter may read them (its schema is newer than this list).
        if slots and max(slots) >= size or 0 < min(slots, default=0) < 4:
            raise _Corrupt(f"{what}: a field of the {size}-byte table at byte {pos} lies outside it")
        return _Table(pos, size, slots)

    def field(self, t: _Table, slot: int, size: int, what: str) -> Optional[int]:
        """Position of a field of ``size`` bytes, or None when the table leaves it out."""
        voff = t.slots[slot] if slot < len(t.slots) else 0
        if voff == 0:
            return None
        if voff + size > t.size:
            raise _Corrupt(f"{what}: field at +{voff} lies outside its {t.size}-byte table")
        pos = t.pos + voff
        if pos % size:
            raise _Corrupt(f"{what}: {size}-byte field at byte {pos} is misaligned")
        return pos

    def scalar(self, t: _Table, slot: int, fmt: str, default: int, what: str) -> int:
        s = _SCALARS[fmt]
        pos = self.field(t, slot, s.size, what)
        return default if pos is None else s.unpack_from(self.data, pos)[0]

    def target(self, t: _Table, slot: int, what: str) -> Optional[int]:
        pos = self.field(t, slot, 4, what)
        return None if pos is None else self.offset(pos, what)

    def offset(self, pos: int, what: str) -> int:
        """Where the uoffset stored at ``pos`` points (``pos`` is known to be inside the file)."""
        o = _U32(self.data, pos)[0]
        if o == 0 or o >= 1 << 31:  # as flatbuffers' own verifier: never self, never wrapping
            raise _Corrupt(f"{what}: offset {o} at byte {pos} is invalid")
        to = pos + o
        if to + 4 > self.n:
            raise _Corrupt(f"{what}: offset to byte {to} is past the end of the {self.n}-byte file")
        return to

    def vector(self, t: _Table, slot: int, elem: int, what: str) -> Tuple[int, int]:
        """``(start, length)`` of a vector field; ``(0, 0)`` when absent."""
        to = self.target(t, slot, what)
        if to is None:
            return 0, 0
        if to % 4:
            raise _Corrupt(f"{what}: vector at byte {to} is not 4-byte aligned")
        length = _U32(self.data, to)[0]
        if to + 4 + length * elem > self.n:
            raise _Corrupt(f"{what}: vector of {length} elements at byte {to} runs past the end "
                           f"of the {self.n}-byte file")
        return to + 4, length

    def ints(self, t: _Table, slot: int, what: str) -> Sequence[int]:
        start, length = self.vector(t, slot, 4, what)
        return _array("i", length)(self.data, start) if length else ()

    def string(self, t: _Table, slot: int, what: str) -> Optional[str]:
        start, length = self.vector(t, slot, 1, what)
        if start == 0:
            return None
        end = start + length
        if end >= self.n or self.data[end] != 0:
            raise _Corrupt(f"{what}: string at byte {start - 4} has no terminating NUL")
        try:
            return self.data[start:end].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Corrupt(f"{what}: not valid UTF-8 (byte {exc.start} of "
                           f"{self.data[start:end]!r:.60})") from None

    def tables(self, t: _Table, slot: int, what: str) -> List[_Table]:
        start, length = self.vector(t, slot, 4, what)
        out = []
        for i in range(length):
            try:
                out.append(self.table(self.offset(start + 4 * i, "offset"), "table"))
            except _Corrupt as exc:
                raise _Corrupt(f"{what}[{i}]: {exc}") from None
        return out

    def subtable(self, t: _Table, slot: int, what: str) -> Optional[_Table]:
        to = self.target(t, slot, what)
        return None if to is None else self.table(to, what)


def verify_tflite(data: bytes, where: str, *, error: Type[EdgecapError] = BundleError,
                  fix: str = "re-export it") -> ModelInfo:
    """Checks that ``data`` is a whole, self-consistent TFLite flatbuffer.

    Args:
      data: The file's bytes.
      where: The file, for the message.
      error: The error class to raise (the caller's: ``BundleError``, ``PlanError``).
      fix: What the user should do, ending the message.

    Returns:
      The main subgraph's inputs and outputs, read without an interpreter
      (what a plan checks its segments against before any worker opens them).

    Raises:
      EdgecapError: ``error``, with one line naming the file and what is wrong.
    """
    if len(data) < 8 or bytes(data[4:8]) != IDENTIFIER:
        raise error(f"{where}: not a TFLite model (no TFL3 identifier at bytes 4..8); {fix}")
    try:
        return _verify(_Walker(bytes(data)))
    except _Corrupt as exc:
        raise error(f"{where}: {exc.kind} ({exc}); {fix}") from None


def _verify(w: _Walker) -> ModelInfo:
    model = w.table(w.offset(0, "root offset"), "model")
    codes = w.tables(model, _MODEL_OPCODES, "operator_codes")
    builtins = []
    custom = []
    for i, code in enumerate(codes):
        name = w.string(code, _OPCODE_CUSTOM, f"operator_codes[{i}].custom_code")
        # As the schema's readers: the larger of the old int8 field and the new int32 one.
        builtins.append(max(w.scalar(code, _OPCODE_DEPRECATED_BUILTIN, "<b", 0, f"operator_codes[{i}]"),
                            w.scalar(code, _OPCODE_BUILTIN, "<i", 0, f"operator_codes[{i}]")))
        # TFLite reads custom_code only for a CUSTOM code: a name beside a builtin code is not a custom op.
        if name and builtins[-1] == _BUILTIN_CUSTOM:
            custom.append(name)
    w.string(model, _MODEL_DESCRIPTION, "description")
    buffer_sizes = []
    for i, b in enumerate(w.tables(model, _MODEL_BUFFERS, "buffers")):
        try:
            buffer_sizes.append(_buffer_size(w, b))
        except _Corrupt as exc:
            raise _Corrupt(f"buffers[{i}].{exc}") from None
    subgraphs = w.tables(model, _MODEL_SUBGRAPHS, "subgraphs")
    if not subgraphs:
        raise _Corrupt("the model has no subgraph")
    n_tensors = []
    main: Optional[ModelInfo] = None
    for i, g in enumerate(subgraphs):
        try:
            n, info = _verify_subgraph(w, g, builtins, buffer_sizes)
            n_tensors.append(n)
            if main is None:
                main = info
        except _Corrupt as exc:
            raise type(exc)(f"subgraphs[{i}].{exc}") from None
    for b in w.ints(model, _MODEL_METADATA_BUFFER, "metadata_buffer"):
        _in_range(b, len(buffer_sizes), "metadata_buffer", "buffers")
    for i, meta in enumerate(w.tables(model, _MODEL_METADATA, "metadata")):
        w.string(meta, _METADATA_NAME, f"metadata[{i}].name")
        index = w.scalar(meta, _METADATA_BUFFER, "<I", 0, f"metadata[{i}].buffer")
        _in_range(index, len(buffer_sizes), f"metadata[{i}].buffer", "buffers")
    for i, sig in enumerate(w.tables(model, _MODEL_SIGNATURES, "signature_defs")):
        here = f"signature_defs[{i}]"
        w.string(sig, _SIGNATURE_KEY, f"{here}.signature_key")
        g = w.scalar(sig, _SIGNATURE_SUBGRAPH, "<I", 0, f"{here}.subgraph_index")
        _in_range(g, len(subgraphs), f"{here}.subgraph_index", "subgraphs")
        for slot, kind in ((_SIGNATURE_INPUTS, "inputs"), (_SIGNATURE_OUTPUTS, "outputs")):
            for j, m in enumerate(w.tables(sig, slot, f"{here}.{kind}")):
                w.string(m, _TENSORMAP_NAME, f"{here}.{kind}[{j}].name")
                index = w.scalar(m, _TENSORMAP_INDEX, "<I", 0, f"{here}.{kind}[{j}].tensor_index")
                _in_range(index, n_tensors[g], f"{here}.{kind}[{j}].tensor_index", f"subgraphs[{g}].tensors")
    # Newer layouts' external buffer tables: checked as tables only.
    w.tables(model, _MODEL_EXTERNAL_GROUPS, "external_buffer_groups")
    w.tables(model, _MODEL_EXTERNAL_BUFFERS, "external_buffers")
    return ModelInfo(main.inputs, main.outputs, tuple(custom))  # type: ignore[union-attr]  # a subgraph exists


def _buffer_size(w: _Walker, b: _Table) -> int:
    _, length = w.vector(b, _BUFFER_DATA, 1, "data")
    offset = w.scalar(b, _BUFFER_OFFSET, "<Q", 0, "offset")
    size = w.scalar(b, _BUFFER_SIZE, "<Q", 0, "size")
    # Models over 2 GB keep buffer data after the flatbuffer (offset from the
    # file's start); offset 1 is the writers' placeholder for "none".
    if offset > 1:
        if offset + size > w.n:
            raise _Corrupt(f"data: bytes {offset}..{offset + size} are past the end of the {w.n}-byte file")
        return size
    return length


def _verify_subgraph(w: _Walker, g: _Table, builtins: List[int],
                     buffer_sizes: List[int]) -> Tuple[int, ModelInfo]:
    tensors = w.tables(g, _SUBGRAPH_TENSORS, "tensors")
    n = len(tensors)
    infos = []
    for i, t in enumerate(tensors):
        try:
            infos.append(_verify_tensor(w, t, buffer_sizes))
        except _Corrupt as exc:
            raise type(exc)(f"tensors[{i}]{exc}") from None
    boundary = []
    for slot, kind in ((_SUBGRAPH_INPUTS, "inputs"), (_SUBGRAPH_OUTPUTS, "outputs")):
        indices = w.ints(g, slot, kind)
        for index in indices:
            _in_range(index, n, kind, "tensors")
        boundary.append(tuple(infos[i] for i in indices))
    w.string(g, _SUBGRAPH_NAME, "name")
    tensor_types = [(t.shape, t.dtype) for t in infos]
    for i, op in enumerate(w.tables(g, _SUBGRAPH_OPERATORS, "operators")):
        try:
            _verify_operator(w, op, builtins, tensor_types)
        except _Corrupt as exc:
            raise type(exc)(f"operators[{i}].{exc}") from None
    return n, ModelInfo(boundary[0], boundary[1])


def _verify_operator(w: _Walker, op: _Table, builtins: List[int],
                     tensor_types: List[Tuple[Tuple[int, ...], str]]) -> None:
    n_tensors = len(tensor_types)
    opcode = w.scalar(op, _OP_OPCODE, "<I", 0, "opcode_index")
    _in_range(opcode, len(builtins), "opcode_index", "operator_codes")
    io = []
    for slot, kind in ((_OP_INPUTS, "inputs"), (_OP_OUTPUTS, "outputs"), (_OP_INTERMEDIATES, "intermediates")):
        indices = w.ints(op, slot, kind)
        for index in indices:
            # -1: an optional input left out (the operator rules say where); an intermediate is
            # never optional (an LSTM reads each one it lists).
            if index != -1 or slot == _OP_INTERMEDIATES:
                _in_range(index, n_tensors, kind, "tensors")
        io.append(indices)
    problem = operator_rules.check_operator(builtins[opcode], io[0], io[1], tensor_types)
    if problem:
        raise _Invalid(problem)
    for type_slot, slot, name in ((_OP_OPTIONS_TYPE, _OP_OPTIONS, "builtin_options"),
                                  (_OP_OPTIONS2_TYPE, _OP_OPTIONS2, "builtin_options_2")):
        if w.scalar(op, type_slot, "<B", 0, f"{name}_type"):
            w.subtable(op, slot, name)
    w.vector(op, _OP_CUSTOM_OPTIONS, 1, "custom_options")
    w.vector(op, _OP_MUTATING, 1, "mutating_variable_inputs")
    offset = w.scalar(op, _OP_LARGE_OFFSET, "<Q", 0, "large_custom_options_offset")
    size = w.scalar(op, _OP_LARGE_SIZE, "<Q", 0, "large_custom_options_size")
    if offset > 1 and offset + size > w.n:
        raise _Corrupt(f"custom options: bytes {offset}..{offset + size} are past the end of the {w.n}-byte file")


def _verify_tensor(w: _Walker, t: _Table, buffer_sizes: List[int]) -> TensorInfo:
    """Checks one tensor; its messages start with " (NAME)." or ".", to follow "tensors[i]"."""
    try:
        name = w.string(t, _TENSOR_NAME, "name")
    except _Corrupt as exc:
        raise _Corrupt(f".{exc}") from None
    try:
        shape = w.ints(t, _TENSOR_SHAPE, "shape")
        dtype = w.scalar(t, _TENSOR_TYPE, "<b", 0, "type")
        buffer = w.scalar(t, _TENSOR_BUFFER, "<I", 0, "buffer")
        # Buffer 0 is the schema's empty sentinel: a model with no buffers at all may name it.
        if buffer or buffer_sizes:
            _in_range(buffer, len(buffer_sizes), "buffer", "buffers")
        quant = w.subtable(t, _TENSOR_QUANT, "quantization")
        if quant is not None:
            for slot, elem, kind in ((_QUANT_MIN, 4, "quantization.min"), (_QUANT_MAX, 4, "quantization.max"),
                                     (_QUANT_SCALE, 4, "quantization.scale"),
                                     (_QUANT_ZERO_POINT, 8, "quantization.zero_point")):
                w.vector(quant, slot, elem, kind)
            w.subtable(quant, _QUANT_DETAILS, "quantization.details")
            start, n = w.vector(quant, _QUANT_ZERO_POINT, 8, "quantization.zero_point")
            problem = operator_rules.check_zero_points(_DTYPES.get(dtype, ""),
                                                       _array("q", n)(w.data, start) if n else ())
            if problem:
                raise _Invalid(f"quantization.zero_point: {problem}")
        sparse = w.subtable(t, _TENSOR_SPARSITY, "sparsity")
        w.ints(t, _TENSOR_SHAPE_SIGNATURE, "shape_signature")
        w.tables(t, _TENSOR_VARIANTS, "variant_tensors")
        w.subtable(t, _TENSOR_EXTERNAL, "external_buffer")
        have = buffer_sizes[buffer] if buffer_sizes else 0
        itemsize = _ITEMSIZE.get(dtype)
        problem = operator_rules.check_tensor(shape, itemsize)
        if problem:
            raise _Invalid(f"shape: {problem}")
        # A sparse tensor's data is its compressed form; only dense constants have a fixed size.
        if have and sparse is None and itemsize is not None and all(d >= 0 for d in shape):
            want = math.prod(shape) * itemsize
            if have != want:
                raise _Corrupt(f"buffer: buffer {buffer} holds {have} bytes, the tensor's shape "
                               f"{list(shape)} needs {want}")
    except _Corrupt as exc:
        raise type(exc)(f" ({name}).{exc}" if name else f".{exc}") from None
    return TensorInfo(name or "", tuple(shape), _DTYPES.get(dtype, f"type{dtype}"))


def _in_range(index: int, count: int, what: str, of: str) -> None:
    if not 0 <= index < count:
        raise _Corrupt(f"{what}: index {index} out of range, the model has {count} {of}")
