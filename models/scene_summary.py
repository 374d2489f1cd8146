"""What the real-world bundle's RNN reads of a frame: class presence, counts, the main object's place.

The encoder gives a 13x13 map of the 80 COCO class scores (``models.nanodet``).
Its summary, the same in numpy here and in the TFLite encoder step
(``models.coco_bundle.summary_tf``), is:

* per class, ``best``: the best score anywhere;
* per class, ``count / MAX_COUNT``: the cells that are the best of their 3x3
  neighbourhood and score at least ``threshold`` (one peak per object; two
  objects closer than a cell, 32 pixels of the 416 frame, count as one), at
  most ``MAX_COUNT``;
* the place of the frame's best class, ``POSITION_GAIN * (x - 0.5)`` and
  ``POSITION_GAIN * (y - 0.5)``: the centre of its cells weighted by how far
  each scores above ``threshold`` (0 where none does).

The place is amplified and per-class places left out because an LSTM fed
per-class places (x, y of all 80 classes) in [0, 1] never learned the motion
(direction right in 54% of made-up windows, the share of still ones); fed the
main place, gained, it learned it in two epochs (99.8%; docs/real-world.md).

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
POSITION_GAIN = 10.0
SUMMARY_SIZE = 2 * NUM_CLASSES + 2
_CENTRES = (np.arange(GRID, dtype=np.float32) + 0.5) / GRID


def summarise(heat: np.ndarray, threshold: float) -> np.ndarray:
    """Returns the summary ``[2*80+2]`` (best, count / MAX_COUNT, the best class's place) of a map ``[13*13*80]``."""
    h = heat.reshape(GRID, GRID, NUM_CLASSES).astype(np.float32)
    padded = np.pad(h, ((1, 1), (1, 1), (0, 0)), constant_values=-1.0)
    neighbourhood = np.max([padded[dy:dy + GRID, dx:dx + GRID] for dy in range(3) for dx in range(3)], axis=0)
    peaks = (h >= neighbourhood) & (h >= threshold)
    count = np.minimum(peaks.sum(axis=(0, 1)).astype(np.float32), MAX_COUNT)
    best = h.max(axis=(0, 1))
    w = np.maximum(h[:, :, int(np.argmax(best))] - threshold, 0.0)
    mass = float(w.sum())
    if mass > 0:
        place = [float((w * _CENTRES[None, :]).sum() / mass) - 0.5, float((w * _CENTRES[:, None]).sum() / mass) - 0.5]
    else:
        place = [0.0, 0.0]
    return np.concatenate([best, count / MAX_COUNT, POSITION_GAIN * np.float32(place)]).astype(np.float32)


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
    ``rule.motion`` between the window's first and last frames where
    something is seen (the place is each frame's best class's).
    """
    s = np.asarray(summaries, np.float32)
    best, counts = s[:, :NUM_CLASSES], s[:, NUM_CLASSES:2 * NUM_CLASSES] * MAX_COUNT
    place = s[:, 2 * NUM_CLASSES:] / POSITION_GAIN
    mean_max = best.mean(axis=0)
    named = [int(c) for c in np.argsort(-mean_max, kind="stable") if mean_max[c] >= rule.threshold]
    named = named[: rule.max_objects]
    objects = tuple((c, max(1, int(round(float(np.median(counts[:, c])))))) for c in named)
    motion = None
    if named:
        seen = np.flatnonzero(best.max(axis=1) >= rule.threshold)
        if len(seen) >= 2:
            first, last = seen[0], seen[-1]
            motion = _direction(float(place[last, 0] - place[first, 0]), float(place[last, 1] - place[first, 1]),
                                rule.motion)
    return Scene(objects, motion)
