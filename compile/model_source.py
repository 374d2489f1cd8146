"""What ``edgecap compile`` was pointed at: a .tflite file or a model bundle directory.

A bundle (docs/bundle.md) names its int8 encoder, which is what gets split, and
its RNN encoder step, whose per-frame time the CPU stage carries: the step the
runtime runs, the int8 one where the bundle ships it (``Bundle.steps``). Bundles are
read by the runtime's loader, so the compiler accepts exactly what the runtime runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple, Union

from edgecap.bundle import Bundle, load_bundle
from edgecap.errors import BundleError
from edgecap_compile.errors import CompileError


@dataclass(frozen=True)
class ModelSource:
    """The model to split and, from a bundle, its RNN step.

    Attributes:
      encoder: The int8 CNN .tflite.
      rnn_step: The RNN encoder step the runtime runs (the bundle's int8 one where
        shipped, else its float one), or None for a bare model.
      file: The encoder's path as plan.json records it (relative to the bundle).
      window: The bundle's window ``(frames, stride)``, or None for a bare model.
    """

    encoder: Path
    rnn_step: Optional[Path]
    file: str
    window: Optional[Tuple[int, int]] = None


def resolve_source(path: Union[str, os.PathLike, Bundle]) -> ModelSource:
    """Resolves a MODEL.tflite or BUNDLE_DIR argument, or a loaded bundle.

    Args:
      path: A .tflite file, a bundle directory holding bundle.json, or a
        ``Bundle`` (used as it is: not loaded again).

    Returns:
      The ``ModelSource``.

    Raises:
      CompileError: If a bundle directory is not a valid bundle (docs/bundle.md).
    """
    if isinstance(path, Bundle):
        bundle = path
    else:
        path = Path(path)
        if not path.is_dir():
            return ModelSource(path, None, path.name)
        try:
            bundle = load_bundle(path)
        except BundleError as e:
            raise CompileError(str(e)) from None
    # The step the runtime runs (``Bundle.steps``: the int8 one where shipped), so its time is the one charged.
    return ModelSource(bundle.encoder, bundle.steps().encoder_step,
                       bundle.encoder.relative_to(bundle.root).as_posix(),
                       (bundle.window.frames, bundle.window.stride))
