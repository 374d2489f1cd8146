"""What a bundle's model knows (its domain), and whether a window is a scene it knows (its calibration).

A captioning model describes whatever it is shown in the words of the world it
was trained on, and says so confidently: the shapes demo calls a street "a
white star moves down". A bundle therefore declares its ``domain`` and carries
a ``calibration`` measured on held-out windows of that world (docs/bundle.md);
``Calibration.scene`` turns a window's confidence, and where the bundle has a
feature calibration its mean encoder feature, into ``known`` or ``unknown``.
A bundle without a calibration gets no judgement (``None``): edgecap cannot
tell, and does not pretend to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import numpy as np

KNOWN = "known"
UNKNOWN = "unknown"
SCENES = (KNOWN, UNKNOWN)  # a caption's ``scene``; None where the bundle has no calibration
KINDS = ("synthetic", "real")  # what bundle.json may declare; "unknown" where it declares nothing


@dataclass(frozen=True)
class Domain:
    """What the bundle says its model knows.

    Attributes:
      kind: ``synthetic`` (a made-up world), ``real`` or ``unknown`` (the
        bundle does not say: bundles from before the field).
      about: What the model knows, in a sentence ("" when unknown).
    """

    kind: str = "unknown"
    about: str = ""

@dataclass(frozen=True)
class Threshold:
    """A calibration statistic and the value below which a window is an unknown scene.

    Attributes:
      unknown_below: Windows whose statistic is below it are unknown scenes.
      statistic: What is compared, in words (bundle.json's ``statistic``).
      percentile: The percentile of the held-out windows' statistic it is, if said.
      heldout_windows: How many held-out windows it was measured on, if said.
    """

    unknown_below: float
    statistic: str = ""
    percentile: Optional[float] = None
    heldout_windows: Optional[int] = None


@dataclass(frozen=True)
class FeatureThreshold(Threshold):
    """A threshold on the cosine of a window's mean encoder feature to the held-out windows' centroid.

    Attributes:
      centroid: The centroid scaled to unit length, float32 ``[feature_size]``.
      centroid_file: The ``.npy`` file inside the bundle it was read from.
    """

    centroid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32), compare=False, repr=False)
    centroid_file: Optional[Path] = None

    def cosine(self, mean_feature: np.ndarray) -> float:
        """The cosine of ``mean_feature`` to the centroid (0 for a zero feature)."""
        norm = float(np.linalg.norm(mean_feature))
        return float(np.dot(mean_feature, self.centroid)) / norm if norm > 0 else 0.0


@dataclass(frozen=True)
class Calibration:
    """The thresholds that tell a bundle's world from others (bundle.json ``calibration``).

    Attributes:
      confidence: On ``Caption.confidence`` (mean token log-probability).
      feature: On the window's mean encoder feature, or None.
    """

    confidence: Threshold
    feature: Optional[FeatureThreshold] = None

    def scene(self, confidence: float, mean_feature: Optional[np.ndarray] = None) -> str:
        """Says whether a window is a scene the model knows.

        Args:
          confidence: The caption's confidence.
          mean_feature: The mean of the window's encoder features (``[feature_size]``);
            needed when the calibration has a ``feature`` threshold.

        Returns:
          ``unknown`` when any threshold says so, else ``known``.
        """
        if confidence < self.confidence.unknown_below:
            return UNKNOWN
        if self.feature is not None and mean_feature is not None:
            if self.feature.cosine(mean_feature) < self.feature.unknown_below:
                return UNKNOWN
        return KNOWN


def notices(name: str, domain: Domain, calibration: Optional[Calibration]) -> List[str]:
    """The lines ``caption``, ``camera`` and ``serve`` say once about what a bundle's model knows.

    Args:
      name: The bundle's name.
      domain: Its domain.
      calibration: Its calibration, or None.

    Returns:
      One line for a synthetic domain, one for a bundle without a calibration; none for a calibrated real one.
    """
    lines = []
    if domain.kind == "synthetic":
        lines.append(f"edgecap: {name} knows only a synthetic world ({domain.about}); "
                     "it describes any scene in that world's words, and marks unknown the scenes its calibration tells apart")
    if calibration is None:
        lines.append(f"edgecap: {name} carries no calibration: edgecap cannot tell the scenes it does not know "
                     "(every caption's scene is null; docs/bundle.md)")
    return lines
