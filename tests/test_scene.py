"""Every caption carries ``scene``, judged by the bundle's calibration; caption and camera say what the model knows (issue #26)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgecap.captioner import EdgeCaptioner
from edgecap.cli import main

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "models" / "demo" / "sample.mp4"


def _set(bundle: Path, **fields) -> Path:
    doc = json.loads((bundle / "bundle.json").read_text())
    for key, value in fields.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    (bundle / "bundle.json").write_text(json.dumps(doc))
    return bundle


def test_the_demo_knows_its_own_sample_and_a_bundle_without_calibration_does_not_judge(bundle_copy: Path):
    with EdgeCaptioner(REPO / "models" / "demo" / "bundle", num_threads=1) as cap:
        captions = list(cap.stream(str(SAMPLE)))
    assert [c.scene for c in captions] == ["known"] * 3
    assert captions[0].to_dict()["scene"] == "known"
    with EdgeCaptioner(_set(bundle_copy, calibration=None), num_threads=1) as cap:
        assert [c.scene for c in cap.stream(str(SAMPLE))] == [None] * 3


def test_the_feature_calibration_reads_the_mean_of_the_windows_encoder_features(bundle_copy: Path):
    from models.domain import cosines, window_features

    features = window_features(bundle_copy, [SAMPLE], all_windows=True)  # [3, 128], as models/ measures them
    np.save(bundle_copy / "centroid.npy", features[0])
    cos = cosines(features, features[0])
    threshold = float(max(cos[1:]) + 1e-4)  # only window 0 is near enough
    assert threshold < 0.9999
    _set(bundle_copy, calibration={"confidence": {"unknown_below": -1e6},
                                   "feature": {"unknown_below": threshold, "centroid": "centroid.npy"}})
    with EdgeCaptioner(bundle_copy, num_threads=1) as cap:
        assert [c.scene for c in cap.stream(str(SAMPLE))] == ["known", "unknown", "unknown"]


def test_caption_marks_unknown_scenes_and_says_once_that_the_bundle_is_synthetic(bundle_copy: Path, capsys):
    _set(bundle_copy, calibration={"confidence": {"unknown_below": -1e-12}})  # every window unknown
    assert main(["caption", str(SAMPLE), "--bundle", str(bundle_copy)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("edgecap: edgecap-demo-shapes knows only a synthetic world (coloured circles")
    assert out.count("knows only") == 1 and err == ""  # on stdout, heading the captions: stderr is for errors
    assert all(line.endswith("   (unknown scene)") for line in lines[1:4]) and lines[1].startswith("[")
    # Beside JSON lines it goes to stderr, once.
    assert main(["caption", str(SAMPLE), "--bundle", str(bundle_copy), "--json"]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["scene"] for line in out.splitlines()] == ["unknown"] * 3
    assert err.count("knows only a synthetic world") == 1 and len(err.splitlines()) == 1


def test_known_scenes_are_not_marked_and_camera_says_it_too(capsys):
    # `camera` on a file: it ends with 'no more frames' (exit 1), after the same lines as caption.
    assert main(["camera", str(SAMPLE), "--bundle", str(REPO / "models" / "demo" / "bundle")]) == 1
    out, err = capsys.readouterr()
    assert "unknown scene" not in out and out.count("s] ") == 3
    assert out.count("edgecap: edgecap-demo-shapes knows only a synthetic world") == 1
    assert err.strip().splitlines() == [f"edgecap: error: {SAMPLE}: no more frames; start it again, or pass "
                                        "--reconnect to wait for it"]


def test_a_bundle_without_domain_or_calibration_says_its_scenes_are_not_judged(bundle_copy: Path, capsys):
    _set(bundle_copy, domain=None, calibration=None)
    assert main(["caption", str(SAMPLE), "--bundle", str(bundle_copy), "--json"]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["scene"] for line in out.splitlines()] == [None] * 3
    assert err.strip().splitlines() == [
        f"edgecap: {json.loads((bundle_copy / 'bundle.json').read_text())['name']} carries no calibration: edgecap "
        "cannot tell the scenes it does not know (every caption's scene is null; docs/bundle.md)"]
