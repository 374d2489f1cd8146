"""What each builtin TFLite operator's kernel needs of its inputs and outputs, from a table.

The flatbuffer walk (``edgecap.tflite_verify``) proves that every index lies in
range; it cannot tell that a CONV_2D whose filter is ``-1`` (the schema's
marker for an optional input left out) reaches a kernel that dereferences it.
This module holds those rules as data, ``data/operator_rules.json``: per
builtin operator code, how many inputs and outputs it takes, which input
positions may be ``-1``, and the ranks and tensor types its kernel accepts at
each position. Builtin operators the table does not list, and custom
operators, are left to the first invoke in a child process
(``edgecap.trial_invoke``).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import msgspec

from edgecap import schema
from edgecap.errors import BundleError

TABLE = Path(__file__).parent / "data" / "operator_rules.json"

OPTIONAL = -1  # the schema's index for an optional input left out


class Rule(msgspec.Struct, forbid_unknown_fields=True):
    """One operator's needs; ``None`` in a list means "any" at that position."""

    code: int
    inputs: Tuple[int, Optional[int]]
    outputs: Tuple[int, Optional[int]]
    optional: Tuple[int, ...] = ()
    input_ranks: Optional[List[Optional[List[int]]]] = None
    output_ranks: Optional[List[Optional[List[int]]]] = None
    input_types: Optional[List[Optional[List[str]]]] = None
    output_types: Optional[List[Optional[List[str]]]] = None


class Table(msgspec.Struct, forbid_unknown_fields=True):
    """``data/operator_rules.json``."""

    about: str
    max_tensor_bytes: int
    zero_point_ranges: Dict[str, Tuple[int, int]]
    operators: Dict[str, Rule]


@functools.lru_cache(maxsize=None)
def load_table(path: Path = TABLE) -> Table:
    """Reads the operator table.

    Raises:
      BundleError: If the file is missing or malformed.
    """
    return schema.read_file(path, Table, what="operator rules table", fix="reinstall edgecap",
                            error=BundleError)


@functools.lru_cache(maxsize=None)
def rules_by_code() -> Dict[int, Tuple[str, Rule]]:
    """Returns ``{builtin code: (name, rule)}`` for every operator the table lists."""
    return {rule.code: (name, rule) for name, rule in load_table().operators.items()}


def max_tensor_bytes() -> int:
    """Returns the largest tensor, in bytes, a model may declare (an edge model needs far less)."""
    return load_table().max_tensor_bytes


def _count(n: int, bounds: Tuple[int, Optional[int]]) -> bool:
    low, high = bounds
    return n >= low and (high is None or n <= high)


def _wanted(per_position: Optional[List[Optional[list]]], position: int) -> Optional[list]:
    if per_position is None or position >= len(per_position):
        return None
    return per_position[position]


def _bounds(bounds: Tuple[int, Optional[int]]) -> str:
    low, high = bounds
    return f"{low}" if low == high else f"{low} or more" if high is None else f"{low} to {high}"


def check_operator(code: int, inputs: Sequence[int], outputs: Sequence[int],
                   tensors: Sequence[Tuple[Tuple[int, ...], str]]) -> Optional[str]:
    """Checks one operator against its rule.

    Args:
      code: Its builtin operator code (``CUSTOM`` and unlisted codes pass).
      inputs: Its input tensor indices, ``-1`` for one left out (all others in range).
      outputs: Its output tensor indices (in range or ``-1``).
      tensors: ``(shape, numpy dtype name)`` of every tensor of the subgraph.

    Returns:
      What is wrong, naming the operator, the position and what its kernel
      needs; None when the operator passes.
    """
    found = rules_by_code().get(code)
    if found is None:
        return None
    name, rule = found
    if not _count(len(inputs), rule.inputs):
        return f"{name} has {len(inputs)} inputs; its kernel takes {_bounds(rule.inputs)}"
    if not _count(len(outputs), rule.outputs):
        return f"{name} has {len(outputs)} outputs; its kernel takes {_bounds(rule.outputs)}"
    for kind, indices, ranks, types in (("input", inputs, rule.input_ranks, rule.input_types),
                                        ("output", outputs, rule.output_ranks, rule.output_types)):
        for position, index in enumerate(indices):
            if index == OPTIONAL:
                if kind == "input" and position in rule.optional:
                    continue
                allowed = (f"only input {', '.join(map(str, rule.optional))} may be left out"
                           if rule.optional else "none may be left out")
                return f"{name}'s {kind} {position} is -1 (left out); {allowed}"
            shape, dtype = tensors[index]
            want_rank = _wanted(ranks, position)
            if want_rank is not None and len(shape) not in want_rank:
                return (f"{name}'s {kind} {position} (tensor {index}) has rank {len(shape)}; its kernel "
                        f"needs rank {' or '.join(map(str, want_rank))}")
            want_type = _wanted(types, position)
            if want_type is not None and dtype not in want_type:
                return (f"{name}'s {kind} {position} (tensor {index}) is {dtype}; its kernel needs "
                        f"{' or '.join(want_type)}")
    return None


def check_tensor(shape: Sequence[int], itemsize: Optional[int]) -> Optional[str]:
    """Checks a tensor's declared shape: no negative dimension, no size past ``max_tensor_bytes``.

    Args:
      shape: Its ``shape`` field (``-1`` belongs in ``shape_signature``, not here).
      itemsize: Bytes per element, None for types of no fixed size.

    Returns:
      What is wrong, or None.
    """
    if any(d < 0 for d in shape):
        return f"shape {list(shape)} has a negative dimension (an interpreter allocates its shape as is)"
    limit = max_tensor_bytes()
    if itemsize is not None and math.prod(shape) * itemsize > limit:
        return f"shape {list(shape)} needs {math.prod(shape) * itemsize} bytes, over the {limit}-byte bound"
    return None


def check_zero_points(dtype: str, zero_points: Sequence[int]) -> Optional[str]:
    """Checks a quantized tensor's zero points against its type's range (a kernel indexes tables by them).

    Args:
      dtype: The tensor's numpy dtype name.
      zero_points: Its quantization's zero points.

    Returns:
      What is wrong, or None.
    """
    bounds = load_table().zero_point_ranges.get(dtype)
    if bounds is None:
        return None
    low, high = bounds
    for z in zero_points:
        if not low <= z <= high:
            return f"{z} is outside {dtype}'s range {low}..{high}"
    return None
