"""What ``edgecap compile`` was pointed at: a .tflite file or a model bundle directory.

A bundle (docs/bundle.md) names its int8 encoder, which is what gets split, and
its RNN encoder step, whose per-frame time the CPU stage carries.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from edgecap_compile.errors import CompileError


@dataclass(frozen=True)
class ModelSource:
    """The model to split and, from a bundle, its RNN step.

    Attributes:
      encoder: The int8 CNN .tflite.
      rnn_step: The bundle's RNN encoder step .tflite, or None for a bare model.
      file: The encoder's path as plan.json records it (relative to the bundle).
    """

    encoder: Path
    rnn_step: Optional[Path]
    file: str


def _inside(root: Path, relative: object, field: str) -> Path:
    if not isinstance(relative, str) or not relative:
        raise CompileError(f"{root / 'bundle.json'}: '{field}' must name a file in the bundle")
    path = (root / relative).resolve()
    if root.resolve() not in path.parents:
        raise CompileError(f"{root / 'bundle.json'}: '{field}' ({relative}) leaves the bundle "
                           "directory; keep every file inside it")
    return path


def resolve_source(path: Union[str, os.PathLike]) -> ModelSource:
    """Resolves a MODEL.tflite or BUNDLE_DIR argument.

    Args:
      path: A .tflite file or a bundle directory holding bundle.json.

    Returns:
      The ``ModelSource``.

    Raises:
      CompileError: If a bundle's bundle.json is missing, malformed, or points outside it.
    """
    path = Path(path)
    if not path.is_dir():
        return ModelSource(path, None, path.name)
    manifest = path / "bundle.json"
    try:
        bundle = json.loads(manifest.read_text())
    except OSError as e:
        raise CompileError(f"cannot read {manifest}: {e.strerror or e}; pass a bundle "
                           "directory or a .tflite file") from None
    except ValueError as e:
        raise CompileError(f"{manifest} is not valid JSON: {e}") from None
    if not isinstance(bundle, dict) or bundle.get("schema_version") != 1:
        raise CompileError(f"{manifest}: schema_version must be 1 (see docs/bundle.md)")
    encoder = _inside(path, bundle.get("encoder"), "encoder")
    rnn = bundle.get("rnn") or {}
    step = rnn.get("encoder_step") if isinstance(rnn, dict) else None
    rnn_step = _inside(path, step, "rnn.encoder_step") if step is not None else None
    return ModelSource(encoder, rnn_step, bundle["encoder"])
