"""What a .tflite file is at its boundary, read once: tensors, operator count and SHA-256.

A bundle's loader opens each model once to validate it and records a
``ModelFile``; plans, the captioner and the compiler's cache key read that
record instead of opening or hashing the file again.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Tuple, Type

from edgecap import files, trial_invoke
from edgecap.errors import BundleError, EdgecapError
from edgecap.interpreter import describe_interpreter, make_cpu_interpreter
from edgecap.tflite_verify import verify_tflite


@dataclass(frozen=True)
class TensorSpec:
    """A tensor at a model or stage boundary, named as in the source model.

    ``scale`` and ``zero_point`` are 0 for a tensor that is not quantized.
    """

    name: str
    shape: Tuple[int, ...]
    dtype: str
    scale: float
    zero_point: int

    @classmethod
    def from_details(cls, d: Dict[str, Any]) -> "TensorSpec":
        """Returns the spec of an interpreter's input or output detail dict."""
        scale, zero_point = d["quantization"]
        return cls(
            name=d["name"],
            shape=tuple(int(x) for x in d["shape"]),
            dtype=d["dtype"].__name__,
            scale=float(scale),
            zero_point=int(zero_point),
        )

    def to_json(self) -> Dict[str, Any]:
        """Returns the tensor as plan.json writes it (docs/plan.md)."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "scale": self.scale, "zero_point": self.zero_point}

    @property
    def quantization(self) -> Tuple[float, int]:
        """``(scale, zero_point)`` as interpreter details carry it."""
        return self.scale, self.zero_point


@dataclass(frozen=True)
class ModelFile:
    """A .tflite file as its interpreter saw it.

    Attributes:
      path: The file, absolute.
      sha256: Hex SHA-256 of its bytes.
      ops: Operators of its main subgraph (delegate nodes not counted).
      inputs: Its input tensors.
      outputs: Its output tensors.
      edgetpu: True when edgetpu_compiler compiled it: only an EdgeTPU runs it
        (its ``edgetpu-custom-op`` has no CPU kernel).
    """

    path: Path
    sha256: str
    ops: int
    inputs: Tuple[TensorSpec, ...]
    outputs: Tuple[TensorSpec, ...]
    edgetpu: bool = False


def open_model(path: "str | os.PathLike[str]",
               error: Type[EdgecapError] = BundleError) -> Tuple[ModelFile, Any]:
    """Reads a .tflite file once, verifies it, opens it on the CPU and records it.

    Args:
      path: The model file.
      error: What to raise for a corrupt file (``tflite_verify``).

    Returns:
      ``(ModelFile, interpreter)``; the interpreter is for the caller's checks.
      An EdgeTPU-compiled model's interpreter is read but not allocated (its
      custom op has no CPU kernel; ``ModelFile.edgetpu`` says so): never invoke it.

    Raises:
      EdgecapError: ``error``, if the file cannot be read (missing, not a regular
        file, over ``edgecap.files``' bound, permission denied), is not a whole,
        consistent TFLite flatbuffer, or crashes its first invoke in a child
        process (``edgecap.trial_invoke``).
      ValueError, RuntimeError: If the interpreter rejects it.
    """
    data = files.read_bytes(path, what="model", fix="re-export it", kind="model", error=error)
    # Not every interpreter verifies what it parses (ai-edge-litert 1.4 and
    # tflite_runtime crash on a truncated file): refuse it first.
    compiled = verify_tflite(data, str(path), error=error).edgetpu_compiled
    if not compiled:  # a compiled model is only described here, never allocated on the CPU
        # What the verifier cannot see would crash this process: a child invokes it first.
        trial_invoke.check(data, path, error=error)
    interp = describe_interpreter(data) if compiled else make_cpu_interpreter(data)
    # The model's own nodes come first; the delegates the backend applied are appended.
    ops = sum(1 for op in interp._get_ops_details() if op["op_name"] != "DELEGATE")
    model = ModelFile(
        path=Path(path).resolve(),
        sha256=hashlib.sha256(data).hexdigest(),  # the bytes the interpreter got: read once
        ops=ops,
        inputs=tuple(TensorSpec.from_details(d) for d in interp.get_input_details()),
        outputs=tuple(TensorSpec.from_details(d) for d in interp.get_output_details()),
        edgetpu=compiled,
    )
    return model, interp
