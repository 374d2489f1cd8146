"""How much work one TFLite operator does: multiply-accumulates and element operations.

The cost model turns these two counts into time per device. MACs are the
products summed by convolutions and matrix products; elements are the values
that pooling, element-wise, reduction and data-movement operators touch, plus
the outputs of the MAC operators (each is requantized, biased and clamped).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable, Dict, Optional, Sequence


@dataclass(frozen=True)
class Work:
    """The work of one operator.

    Attributes:
      macs: Multiply-accumulates.
      elements: Values produced or read by non-MAC computation.
      known: False when the operator had no rule and a safe default was used.
    """

    macs: int
    elements: int
    known: bool = True


@dataclass(frozen=True)
class OpShapes:
    """The shapes an operator rule looks at.

    Attributes:
      inputs: Shapes of the operator's inputs in order (None for an omitted optional input).
      outputs: Shapes of its outputs.
      options: The builtin options object (schema object API), or None.
    """

    inputs: Sequence[Optional[Sequence[int]]]
    outputs: Sequence[Sequence[int]]
    options: object = None


def _size(shape: Optional[Sequence[int]]) -> int:
    return int(prod(shape)) if shape is not None else 0


def _out(s: OpShapes) -> int:
    return sum(_size(shape) for shape in s.outputs)


def _conv(s: OpShapes) -> Work:
    # Filter [out, kh, kw, in / groups].
    kh, kw, cin = s.inputs[1][1:4]
    return Work(_out(s) * kh * kw * cin, _out(s))


def _depthwise(s: OpShapes) -> Work:
    # Filter [1, kh, kw, out]: one kh*kw window per output value.
    kh, kw = s.inputs[1][1:3]
    return Work(_out(s) * kh * kw, _out(s))


def _fully_connected(s: OpShapes) -> Work:
    return Work(_out(s) * s.inputs[1][-1], _out(s))


def _transpose_conv(s: OpShapes) -> Work:
    # Inputs (output_shape, filter [out, kh, kw, in], input): every input value
    # is scattered through a kh*kw*out window.
    cout, kh, kw = s.inputs[1][0:3]
    return Work(_size(s.inputs[2]) * kh * kw * cout, _out(s))


def _batch_matmul(s: OpShapes) -> Work:
    adj_x = bool(getattr(s.options, "adjX", False))
    a = s.inputs[0]
    return Work(_out(s) * (a[-2] if adj_x else a[-1]), _out(s))


def _pool(s: OpShapes) -> Work:
    window = getattr(s.options, "filterHeight", 1) * getattr(s.options, "filterWidth", 1)
    return Work(0, _out(s) * window)


def _reduce(s: OpShapes) -> Work:
    return Work(0, _size(s.inputs[0]))


def _elementwise(s: OpShapes) -> Work:
    return Work(0, _out(s))


def _free(s: OpShapes) -> Work:
    # Shape-only operators: the interpreter aliases or memcpy's the buffer.
    return Work(0, 0)


_RULES: Dict[str, Callable[[OpShapes], Work]] = {
    "CONV_2D": _conv,
    "DEPTHWISE_CONV_2D": _depthwise,
    "FULLY_CONNECTED": _fully_connected,
    "TRANSPOSE_CONV": _transpose_conv,
    "BATCH_MATMUL": _batch_matmul,
    **dict.fromkeys(("AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D"), _pool),
    **dict.fromkeys(
        ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "ARG_MAX", "ARG_MIN"), _reduce
    ),
    **dict.fromkeys(
        (
            "ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "RELU",
            "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "LEAKY_RELU", "PRELU", "LOGISTIC", "TANH",
            "HARD_SWISH", "ELU", "GELU", "SOFTMAX", "LOG_SOFTMAX", "QUANTIZE", "DEQUANTIZE",
            "ABS", "NEG", "SQRT", "RSQRT", "EXP", "LOG", "POW", "SQUARE", "CAST",
            "L2_NORMALIZATION", "LOCAL_RESPONSE_NORMALIZATION", "CONCATENATION", "PAD", "PADV2",
            "MIRROR_PAD", "TRANSPOSE", "SPACE_TO_DEPTH", "DEPTH_TO_SPACE", "RESIZE_BILINEAR",
            "RESIZE_NEAREST_NEIGHBOR", "STRIDED_SLICE", "SLICE", "SPLIT", "SPLIT_V", "PACK",
            "UNPACK", "GATHER", "TILE", "BROADCAST_TO", "SELECT", "SELECT_V2", "ADD_N",
        ),
        _elementwise,
    ),
    **dict.fromkeys((
        "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "SHAPE", "VAR_HANDLE", "READ_VARIABLE",
        "ASSIGN_VARIABLE", "CALL_ONCE",
    ), _free),
}


def op_work(op_type: str, shapes: OpShapes) -> Work:
    """Counts the work of one operator.

    Args:
      op_type: Builtin operator name, e.g. ``CONV_2D``, or a custom op's code.
      shapes: The operator's tensor shapes and options.

    Returns:
      Its ``Work``. An operator without a rule is charged every value it reads
      and writes as element work, and comes back with ``known=False``.
    """
    rule = _RULES.get(op_type)
    if rule is not None:
        try:
            return rule(shapes)
        except (IndexError, TypeError, ValueError):
            pass  # A malformed operand list: fall through to the default.
    touched = _out(shapes) + sum(_size(shape) for shape in shapes.inputs)
    return Work(0, touched, known=False)
