"""What the real-world bundle's RNN reads of a frame: class presence, counts and positions.

The encoder gives a 13x13 map of the 80 COCO class scores (``models.nanodet``).
Its summary, the same in numpy here and in the TFLite encoder step
(``models.coco_bundle``), is per class:

* ``max``: the best score anywhere;
* ``count``: the cells that are the best of their 3x3 neighbourhood and score
  at least ``threshold`` (one peak per object; two objects closer than a cell,
  32 pixels of the 416 frame, count as one), at most ``MAX_COUNT``;
* ``x``, ``y``: the centre of the class's cells weighted by how far each scores
  above ``threshold``, from 0 (left, top) to 1, or 0.5 where none does;

and, last, the ``x`` and ``y`` of the frame's best class, so that the LSTM
reads the main object's motion from two values wherever its class is.

``template_scene`` is the deterministic decoder over a window of summaries
that the trained LSTM is compared with. Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from models.coco_words import Scene
from models.nanodet import GRID, NUM_CLASSES

MAX_COUNT = 5.0
SUMMARY_SIZE = 4 * NUM_CLASSES + 2
_CENTRES = (np.arange(GRID, dtype=np.float32) + 0.5) / GRID


def summarise(heat: np.ndarray, threshold: float) -> np.ndarray:
    """Returns the summary ``[4*80]`` (max, count, x, y, each per class) of a map ``[13*13*80]``."""
    h = heat.reshape(GRID, GRID, NUM_CLASSES).astype(np.float32)
    padded = np.pad(h, ((1, 1), (1, 1), (0, 0)), constant_values=-1.0)
    neighbourhood = np.max([padded[dy:dy + GRID, dx:dx + GRID] for dy in range(3) for dx in range(3)], axis=0)
    peaks = (h >= neighbourhood) & (h >= threshold)
    count = np.minimum(peaks.sum(axis=(0, 1)).astype(np.float32), MAX_COUNT)
    w = np.maximum(h - threshold, 0.0)
    mass = w.sum(axis=(0, 1))
    safe = np.maximum(mass, 1e-6)
    x = np.where(mass > 0, (w * _CENTRES[None, :, None]).sum(axis=(0, 1)) / safe, 0.5)
    y = np.where(mass > 0, (w * _CENTRES[:, None, None]).sum(axis=(0, 1)) / safe, 0.5)
    best = h.max(axis=(0, 1))
    main = int(np.argmax(best))
    return np.concatenate([best, count, x, y, [x[main], y[main]]]).astype(np.float32)


@dataclass(frozen=True)
class TemplateRule:
    """The template decoder's thresholds (chosen on images apart from the report set).

    Attributes:
      threshold: Lowest window-mean class score that names a class.
      motion: Least travel of the main object's centre, as a fraction of the frame, that is a motion.
      max_objects: Most classes named.
    """

    threshold: float
    motion: float = 0.08
    max_objects: int = 3


def _direction(dx: float, dy: float, least: float) -> Optional[str]:
    if max(abs(dx), abs(dy)) < least:
        return None
    if abs(dx) >= abs(dy):
        return "right" if dx > 0 else "left"
    return "down" if dy > 0 else "up"


def template_scene(summaries: Sequence[np.ndarray], rule: TemplateRule) -> Scene:
    """Decodes a window of frame summaries ``[N, 4*80]`` into a scene, deterministically.

    A class is named when its mean best score over the window reaches the
    threshold; its count is the median of its per-frame peak counts (at least
    one); the main object (the best) moves when its centre travels at least
    ``rule.motion`` between the window's first and last frames where it is seen.
    """
    s = np.asarray(summaries, np.float32)[:, :4 * NUM_CLASSES].reshape(len(summaries), 4, NUM_CLASSES)
    mean_max = s[:, 0].mean(axis=0)
    named = [int(c) for c in np.argsort(-mean_max, kind="stable") if mean_max[c] >= rule.threshold]
    named = named[: rule.max_objects]
    objects = tuple((c, max(1, int(round(float(np.median(s[:, 1, c])))))) for c in named)
    motion = None
    if named:
        main = named[0]
        seen = np.flatnonzero(s[:, 0, main] >= rule.threshold)
        if len(seen) >= 2:
            first, last = seen[0], seen[-1]
            motion = _direction(float(s[last, 2, main] - s[first, 2, main]),
                                float(s[last, 3, main] - s[first, 3, main]), rule.motion)
    return Scene(objects, motion)
