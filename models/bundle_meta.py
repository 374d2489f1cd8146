"""What a recipe-built bundle says about itself: its weights and its encoder's input normalisation.

Pure Python, no TensorFlow, so that the bundle metadata the recipes write
(``models.backbones``, ``models.paper_bundles``) is tested in the default suite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

# What the weights of a bundle are; edgecap.bundle reads the same field
# ("trained" when absent). Only "trained" captions mean anything.
WEIGHTS = ("trained", "imagenet", "random")
_NOTES = {
    "trained": "encoder and decoder trained together on captions",
    "imagenet": "ImageNet-pretrained encoder, untrained decoder: captions measure speed and "
                "exactness, not quality",
    "random": "random weights: captions measure speed and exactness, not quality",
}


def weights_note(weights: str) -> str:
    """Returns the one-line meaning of a ``weights`` value (one of ``WEIGHTS``).

    Raises:
      ValueError: For a value outside ``WEIGHTS``.
    """
    if weights not in _NOTES:
        raise ValueError(f"weights {weights!r}: use one of {', '.join(WEIGHTS)}")
    return _NOTES[weights]


@dataclass(frozen=True)
class InputNorm:
    """Channel order and per-channel ``(pixel - mean) / std`` a CNN's first layer expects."""

    color_order: str
    mean: Tuple[float, float, float]
    std: Tuple[float, float, float]

    def as_input(self, size: int) -> Dict[str, object]:
        """Returns the bundle.json ``input`` object for a square ``size`` frame."""
        return {"height": size, "width": size, "channels": 3, "color_order": self.color_order,
                "mean": list(self.mean), "std": list(self.std)}


# The two conventions of keras.applications' preprocess_input: "tf" scales to
# [-1, 1] (MobileNetV2, InceptionV3, the demo); "caffe" is BGR minus the
# ImageNet channel means (ResNet50). Kept so that ImageNet weights, swapped in,
# see the frames they were trained on.
TF_NORM = InputNorm("RGB", (127.5, 127.5, 127.5), (127.5, 127.5, 127.5))
CAFFE_NORM = InputNorm("BGR", (103.939, 116.779, 123.68), (1.0, 1.0, 1.0))
