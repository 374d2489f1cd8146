"""The shipped demo captions clips it never saw at close to its quality goal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgecap.captioner import EdgeCaptioner
from edgecap_lab.evaluate import evaluate
from models.dataset import FPS, random_spec, render_clip, write_dataset

# Training data is rendered from default_rng([seed, i]) with small dataset seeds;
# these seeds are far from any of them.
FRESH_SEED = 90_210
# The goal is 90%; the demo sits at 99.8-100% across held-out sets (README). The
# floor is well above the goal, so a regression shows, yet leaves room for an
# interpreter version that rounds an int8 kernel differently.
MIN_EXACT_MATCH = 0.96


@pytest.fixture(scope="module")
def fresh_clips() -> list:
    clips = []
    for i in range(300):
        rng = np.random.default_rng([FRESH_SEED, i])
        clips.append(render_clip(random_spec(rng), rng))
    return clips


def test_fresh_clips_match_ground_truth(shipped_bundle: Path, fresh_clips: list) -> None:
    hits = []
    with EdgeCaptioner(shipped_bundle) as cap:
        for frames, truth in fresh_clips:
            captions = list(cap.stream(frames, fps=FPS))
            assert len(captions) == 1, "a 16-frame clip at 16 fps is one window at 8 fps"
            hits.append(captions[0].text == truth)
    rate = float(np.mean(hits))
    assert rate >= MIN_EXACT_MATCH, f"exact match {rate:.0%} on {len(hits)} fresh clips"


def test_eval_report(shipped_bundle: Path, tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data", 12, seed=FRESH_SEED + 1, split_fractions=(0, 0, 1))
    report = evaluate(shipped_bundle, data.root, split="test")
    assert report.clips == 12
    exact = np.mean([c["int8"] == c["references"][0] for c in report.captions.values()])
    assert report.exact_match == pytest.approx(exact)
    assert 0.0 <= report.bleu4 <= 1.0 and report.cider_d >= 0.0
    if report.exact_match == 1.0:
        assert report.bleu4 == pytest.approx(1.0, abs=1e-6)
    agree = np.mean([c["int8"] == c["float"] for c in report.captions.values()])
    assert report.agreement == pytest.approx(agree)
    # Eval decodes a clip's first window once for both encoders; it must caption
    # what streaming the file does.
    with EdgeCaptioner(shipped_bundle) as cap:
        for clip_id in list(report.captions)[:4]:
            first = next(iter(cap.stream(str(data.clip_path(clip_id)))))
            assert report.captions[clip_id]["int8"] == first.text
