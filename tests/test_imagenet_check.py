"""models.imagenet_check: top-5 from 1000- and 1001-class outputs, retrieval of embeddings, its CLI."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from models import imagenet_check as ic

LABELS = ic.LABELS.read_text(encoding="utf-8").splitlines()


def test_the_shipped_labels_are_background_then_the_1000_imagenet_classes():
    assert len(LABELS) == 1001 and LABELS[0] == "background"
    assert LABELS[1].startswith("tench") and LABELS[286].startswith("Egyptian cat")


def test_a_1000_class_output_skips_background_and_a_1001_class_one_keeps_it():
    logits = np.full(1000, -5.0)
    logits[285], logits[281] = 4.0, 3.0  # 0-based ImageNet ids: Egyptian cat, tabby
    top = ic.top_k(logits, LABELS)
    assert [g.label for g in top[:2]] == ["Egyptian cat", "tabby"]
    assert top[0].probability > top[1].probability > top[2].probability
    # Coral's classifiers end in a softmax over 1001 (background first), quantized.
    probs = np.zeros(1001)
    probs[286], probs[282], probs[0] = 0.6, 0.3, 0.1
    top = ic.top_k(probs, LABELS)
    assert [(g.label, g.probability) for g in top[:3]] == [
        ("Egyptian cat", 0.6), ("tabby", 0.3), ("background", 0.1)]
    with pytest.raises(ValueError, match="not an ImageNet classifier"):
        ic.top_k(np.zeros(10), LABELS)


def test_each_photo_s_nearest_other_view_is_found_by_cosine_similarity():
    rng = np.random.default_rng(0)
    base = {n: rng.normal(size=64) for n in ("cat", "cup", "rocket")}
    views = {n: (v, v + rng.normal(scale=0.1, size=64)) for n, v in base.items()}
    hits = ic.nearest_views(views)
    assert {n: h for n, (h, _) in hits.items()} == {"cat": "cat", "cup": "cup", "rocket": "rocket"}
    assert all(0.9 < s <= 1.0 for _, s in hits.values())


def test_the_check_runs_the_runtime_preprocessing_on_photos_and_prints_a_table(tmp_path):
    # The demo encoder stands in for an extractor: the path, not the figures, is tested.
    encoder = ic.LABELS.parents[1] / "demo" / "bundle" / "encoder.tflite"
    for k, color in enumerate(((0, 0, 255), (0, 255, 0))):
        img = np.zeros((90, 120, 3), np.uint8)
        cv2.circle(img, (60, 45), 30, color, -1)
        cv2.imwrite(str(tmp_path / f"p{k}.png"), img)
    result = ic.check(sorted(tmp_path.glob("*.png")), [], [("demo", encoder, 127.5, 127.5)], LABELS)
    assert set(result["nearest"]["demo"]) == {"p0", "p1"}
    text = ic.table(result)
    assert text.splitlines()[0] == "| photo | demo |" and "nearest view:" in text


def test_a_missing_model_or_unreadable_photo_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "photo.png").write_text("not an image")
    assert ic.main(["--photos", str(tmp_path / "photo.png"),
                    "--classifier", "x", str(tmp_path / "none.tflite"), "128", "128"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "none.tflite: no such file" in err
    encoder = ic.LABELS.parents[1] / "demo" / "bundle" / "encoder.tflite"
    assert ic.main(["--photos", str(tmp_path / "photo.png"),
                    "--extractor", "demo", str(encoder), "127.5", "127.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not an image OpenCV reads" in err


def test_a_quantized_softmax_summing_under_1_is_read_as_probabilities_not_softmaxed_again():
    # Coral's uint8 softmax (scale 1/256) rounds the tail to 0: the astronaut photo's sums to 0.87.
    probs = np.zeros(1001)
    probs[[440, 560, 519]] = [0.1796875, 0.1, 0.05]
    probs[1:500:10] += 0.01
    top = ic.top_k(probs, LABELS)
    assert 0.5 < probs.sum() < 1 and top[0].probability == 0.18
