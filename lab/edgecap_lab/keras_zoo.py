"""The benchmark's Keras architectures, random weights, full-int8, generated once and cached.

TensorFlow is needed only to generate a missing model; a cached file is reused
as is. Run ``python -m edgecap_lab.keras_zoo`` (with TensorFlow) to fill
the cache ahead of ``python -m edgecap_lab.compile_benchmark``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, Tuple

ARCHITECTURES: Dict[str, Tuple[str, Tuple[int, int, int]]] = {
    # name: (keras.applications constructor, input shape)
    "MobileNetV2": ("MobileNetV2", (224, 224, 3)),
    "ResNet50": ("ResNet50", (224, 224, 3)),
    "InceptionV3": ("InceptionV3", (224, 224, 3)),
    "EfficientNetB0": ("EfficientNetB0", (224, 224, 3)),
}


def cache_dir() -> Path:
    """Returns the cache folder, ``$EDGECAP_CACHE`` or ``~/.cache/edgecap``, plus ``keras-int8``."""
    root = os.environ.get("EDGECAP_CACHE") or os.path.join(Path.home(), ".cache", "edgecap")
    return Path(root) / "keras-int8"


def model_path(name: str, generate: bool = True) -> Path:
    """Returns the cached int8 .tflite of an architecture, generating it when missing.

    Args:
      name: A key of ``ARCHITECTURES``.
      generate: Whether to build a missing model (needs TensorFlow).

    Returns:
      Path of the cached model.

    Raises:
      FileNotFoundError: If the model is missing and ``generate`` is false.
      ImportError: If it must be generated and TensorFlow is absent.
    """
    path = cache_dir() / f"{name.lower()}_int8.tflite"
    if path.exists():
        return path
    if not generate:
        raise FileNotFoundError(
            f"{path} missing: run `python -m edgecap_lab.keras_zoo` with TensorFlow installed")
    import keras

    from edgecap_compile.int8_export import export_int8

    constructor, shape = ARCHITECTURES[name]
    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, constructor)(weights=None, input_shape=shape)
    low, high = (0.0, 255.0) if name.startswith("EfficientNet") else (-1.0, 1.0)
    data = export_int8(model, shape, samples=4, low=low, high=high)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


if __name__ == "__main__":
    for arch in sys.argv[1:] or ARCHITECTURES:
        print(model_path(arch))
