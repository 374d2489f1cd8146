"""The real-data benchmark's scores (models/real_bench.py) and the recipe's labels (models/coco_bundle.py)."""

from __future__ import annotations

import numpy as np

from models import coco_bundle, coco_words
from models.nanodet import Detection
from models.real_bench import clip_scores, noun_pr

IDX = coco_words.class_index()
P, C, D = IDX["person"], IDX["car"], IDX["dog"]


def test_noun_precision_and_recall_are_micro_averaged():
    said = {"a": {P, C}, "b": set(), "c": {D}}
    truth = {"a": {P}, "b": {C}, "c": {D}}
    r = noun_pr(said, truth)
    assert r["noun_precision"] == round(2 / 3, 4) and r["noun_recall"] == round(2 / 3, 4) and r["claims"] == 3


def test_clip_scores_count_false_claims_and_allow_the_ambiguous():
    captions = ["a car", "a person and a car", "nothing I know", "a dog"]
    present = [{C}, {C}, set(), {C}]
    ok = [set(), {P}, set(), set()]
    r = clip_scores(captions, present, ok)
    assert r["no_false_claim"] == 0.75  # only "a dog" is false
    assert r["a_true_claim"] == round(2 / 3, 4)  # of the three windows that show something


def test_labels_need_most_frames_and_take_the_median_count():
    frames = [[Detection(P, 0.9, (0, 0, .1, .1)), Detection(P, 0.8, (.5, .5, .6, .6)), Detection(D, 0.5, (0, 0, 1, 1))],
              [Detection(P, 0.9, (0, 0, .1, .1)), Detection(P, 0.7, (.5, .5, .6, .6))],
              [Detection(P, 0.9, (0, 0, .1, .1)), Detection(C, 0.3, (0, 0, 1, 1))]]
    scene = coco_bundle.label_scene(frames, 0.4, "left")
    assert coco_words.sentence(scene) == "two people ; a person moves left"
    assert coco_bundle.label_scene([[], [], []], 0.4, "left").motion is None


def test_a_pan_moves_the_crop_the_named_way():
    photo = np.zeros((300, 400, 3), np.uint8)
    photo[:, 200:] = 255  # right half white
    rng = np.random.default_rng(0)
    frames = coco_bundle.window_frames(photo, ("pan_right", 0.25, 0.0, 0.7), rng)
    assert len(frames) == 8 and frames[0].shape == (416, 416, 3)
    assert frames[-1].mean() > frames[0].mean()  # the camera moved right, towards the white half
    assert coco_bundle.SCENE_MOTION["pan_right"] == "left"


def test_tokens_round_trip_through_the_vocabulary():
    vocab = coco_bundle.vocabulary()
    text = "many people and an umbrella ; a person moves up"
    assert " ".join(vocab[i] for i in coco_bundle.tokens(text, vocab)) == text
