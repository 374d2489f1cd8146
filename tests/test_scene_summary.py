"""The frame summary and the template decoder of the real-world bundle (models/scene_summary.py)."""

from __future__ import annotations

import numpy as np

from models import coco_words, scene_summary
from models.nanodet import GRID, NUM_CLASSES
from models.scene_summary import TemplateRule, summarise, template_scene

IDX = coco_words.class_index()


def _map(points):
    heat = np.zeros((GRID, GRID, NUM_CLASSES), np.float32)
    for cls, y, x, score in points:
        heat[y, x, cls] = score
    return heat.reshape(-1)


def test_summary_counts_separate_peaks_and_places_them():
    s = summarise(_map([(IDX["person"], 6, 2, 0.7), (IDX["person"], 6, 10, 0.6), (IDX["car"], 1, 1, 0.3)]), 0.4)
    best, count, x, y = s[:-2].reshape(4, NUM_CLASSES)
    assert np.allclose(s[-2:], [x[IDX["person"]], y[IDX["person"]]])  # the best class's place, last
    assert np.isclose(best[IDX["person"]], 0.7) and count[IDX["person"]] == 2
    assert count[IDX["car"]] == 0 and x[IDX["car"]] == 0.5  # under the threshold: no peak, no place
    assert 0.2 < x[IDX["person"]] < 0.5  # pulled towards the stronger, left one


def test_template_names_counts_and_reads_a_pan():
    frames = [summarise(_map([(IDX["dog"], 6, 2 + i, 0.8), (IDX["cat"], 3, 3, 0.5)]), 0.4) for i in range(8)]
    scene = template_scene(frames, TemplateRule(0.4))
    assert coco_words.sentence(scene) == "a dog and a cat ; a dog moves right"
    still = template_scene([frames[0]] * 8, TemplateRule(0.4))
    assert coco_words.sentence(still) == "a dog and a cat"
    assert template_scene([summarise(_map([]), 0.4)] * 8, TemplateRule(0.4)).objects == ()


def test_summary_size():
    assert summarise(_map([]), 0.5).shape == (scene_summary.SUMMARY_SIZE,)
