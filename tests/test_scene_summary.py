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


def test_summary_counts_separate_peaks_and_places_the_best_class():
    s = summarise(_map([(IDX["person"], 6, 2, 0.7), (IDX["person"], 6, 10, 0.6), (IDX["car"], 1, 1, 0.3)]), 0.4)
    best, count = s[:NUM_CLASSES], s[NUM_CLASSES:2 * NUM_CLASSES] * scene_summary.MAX_COUNT
    assert np.isclose(best[IDX["person"]], 0.7) and count[IDX["person"]] == 2
    assert count[IDX["car"]] == 0  # under the threshold: no peak
    x, y = s[-2:] / scene_summary.POSITION_GAIN + 0.5
    assert 0.2 < x < 0.5  # the person's weighted centre, pulled towards the stronger, left one
    assert np.isclose(y, 6.5 / 13)
    assert np.allclose(summarise(_map([(IDX["car"], 1, 1, 0.3)]), 0.4)[-2:], 0.0)  # nothing above: no place


def test_template_names_counts_and_reads_a_pan():
    frames = [summarise(_map([(IDX["dog"], 6, 2 + i, 0.8), (IDX["cat"], 3, 3, 0.5)]), 0.4) for i in range(8)]
    scene = template_scene(frames, TemplateRule(0.4))
    assert coco_words.sentence(scene) == "a cat and a dog ; a dog moves right"
    still = template_scene([frames[0]] * 8, TemplateRule(0.4))
    assert coco_words.sentence(still) == "a cat and a dog"
    assert template_scene([summarise(_map([]), 0.4)] * 8, TemplateRule(0.4)).objects == ()


def test_summary_size():
    assert summarise(_map([]), 0.5).shape == (scene_summary.SUMMARY_SIZE,)
