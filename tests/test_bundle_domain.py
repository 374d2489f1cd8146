"""A bundle says what it knows: bundle.json's ``domain`` and ``calibration`` (issue #26 items 1 and 5)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgecap.bundle import load_bundle
from edgecap.domain import KNOWN, UNKNOWN, Calibration, Domain, FeatureThreshold, Threshold
from test_bad_bundle import _edit, _refused

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent
DOMAIN = {"kind": "synthetic", "about": "coloured shapes"}
CONFIDENCE = {"statistic": "mean token log-probability", "percentile": 2.0, "unknown_below": -0.0003,
              "heldout_windows": 200}


def _with_feature(bundle: Path, centroid: str = "centroid.npy", values=np.ones(128, np.float32), **feature) -> None:
    """Gives the bundle a feature calibration naming ``centroid``; centroid.npy holds ``values`` (None: no file)."""
    if values is not None:
        np.save(bundle / "centroid.npy", values)  # an object array is pickled: load_bundle must not unpickle it
    _edit(bundle, lambda d: d.update(domain=DOMAIN, calibration={"confidence": CONFIDENCE, "feature": {
        "statistic": "cosine", "percentile": 2.0, "unknown_below": 0.6, "heldout_windows": 200,
        "centroid": centroid, **feature}}))


@pytest.mark.parametrize("name", ["demo", "shapes_mobilenet_v1"])
def test_the_shipped_bundles_say_they_know_a_synthetic_world(name: str) -> None:
    bundle = load_bundle(REPO / "models" / name / "bundle")
    assert bundle.domain.kind == "synthetic" and "coloured circles" in bundle.domain.about
    assert bundle.calibration is not None and bundle.calibration.confidence.unknown_below < 0
    assert bundle.calibration.confidence.heldout_windows == 200


def test_the_mobilenet_bundle_carries_its_centroid_as_a_unit_vector_of_its_features() -> None:
    bundle = load_bundle(REPO / "models" / "shapes_mobilenet_v1" / "bundle")
    feature = bundle.calibration.feature
    assert feature is not None and feature.centroid.shape == (bundle.feature_size,)
    assert np.linalg.norm(feature.centroid) == pytest.approx(1.0, abs=1e-5)
    assert feature.centroid_file == bundle.root / "domain_centroid.npy"


def test_a_bundle_without_the_fields_stays_valid_and_its_domain_is_unknown(bundle_copy: Path) -> None:
    _edit(bundle_copy, lambda d: [d.pop("domain", None), d.pop("calibration", None)])
    bundle = load_bundle(bundle_copy)
    assert bundle.domain == Domain("unknown", "") and bundle.calibration is None


def test_a_domain_without_a_calibration_and_null_fields_are_valid(bundle_copy: Path) -> None:
    _edit(bundle_copy, lambda d: [d.update(domain={"kind": "real", "about": "streets"}), d.pop("calibration", None)])
    assert load_bundle(bundle_copy).domain == Domain("real", "streets")
    _edit(bundle_copy, lambda d: d.update(domain=None, calibration=None))
    assert load_bundle(bundle_copy).domain.kind == "unknown"


def test_a_feature_calibration_loads_with_its_centroid(bundle_copy: Path) -> None:
    _with_feature(bundle_copy, values=np.full(128, 3.0, np.float32))
    feature = load_bundle(bundle_copy).calibration.feature
    assert feature.unknown_below == 0.6 and feature.centroid_file == bundle_copy.resolve() / "centroid.npy"
    assert np.allclose(feature.centroid, np.full(128, 128 ** -0.5))


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(domain={"kind": "imaginary", "about": "x"}),
     r"field 'domain.kind' is 'imaginary': say 'synthetic' \(a made-up world\) or 'real' \(docs/bundle.md\)"),
    (lambda d: d.update(domain={"kind": 1, "about": "x"}), r"field 'domain.kind' must be str, got int"),
    (lambda d: d.update(domain={"kind": "real"}), r"field 'domain.about' is missing"),
    (lambda d: d.update(domain={"kind": "real", "about": ""}), r"field 'domain.about' must be str of length >= 1"),
    (lambda d: d.update(domain="synthetic"), r"field 'domain' must be object \| null, got str"),
    (lambda d: d.update(domain={**DOMAIN, "about_it": "x"}), r"field 'domain.about_it' is unknown"),
    (lambda d: d.update(calibration={}), r"field 'calibration.confidence' is missing"),
    (lambda d: d.update(calibration={"confidence": {**CONFIDENCE, "unknown_below": float("nan")}}),
     r"field 'calibration.confidence.unknown_below' must be float >= -1000000.0"),
    (lambda d: d.update(calibration={"confidence": {**CONFIDENCE, "unknown_below": float("-inf")}}),
     r"field 'calibration.confidence.unknown_below' must be float >= -1000000.0"),
    (lambda d: d.update(calibration={"confidence": {**CONFIDENCE, "unknown_below": 0.5}}),
     r"field 'calibration.confidence.unknown_below' must be float <= 0.0"),
    (lambda d: d.update(calibration={"confidence": {**CONFIDENCE, "unknown_below": "-0.1"}}),
     r"field 'calibration.confidence.unknown_below' must be float, got str"),
    (lambda d: d.update(calibration={"confidence": {"unknown_bellow": -0.1}}),
     r"field 'calibration.confidence.unknown_below' is missing|field 'calibration.confidence.unknown_bellow' is unknown"),
    (lambda d: d.update(calibration={"confidence": {**CONFIDENCE, "percentile": 150}}),
     r"field 'calibration.confidence.percentile' must be float <= 100.0"),
    (lambda d: d.update(calibration={"confidence": {**CONFIDENCE, "heldout_windows": 0}}),
     r"field 'calibration.confidence.heldout_windows' must be int >= 1"),
    (lambda d: d.update(calibration={"confidence": CONFIDENCE, "feature": {"unknown_below": 2.0, "centroid": "c.npy"}}),
     r"field 'calibration.feature.unknown_below' must be float <= 1.0"),
    (lambda d: d.update(calibration={"confidence": CONFIDENCE, "feature": {"unknown_below": 0.5}}),
     r"field 'calibration.feature.centroid' is missing"),
])
def test_malformed_fields_are_one_line_naming_the_field(bundle_copy: Path, edit, match: str) -> None:
    _edit(bundle_copy, edit)
    msg = _refused(bundle_copy, match)
    assert msg.startswith(str(bundle_copy / "bundle.json")) and msg.endswith("docs/bundle.md)")


@pytest.mark.parametrize("centroid, values, match", [
    ("../centroid.npy", None, r"field 'calibration.feature.centroid' path '../centroid.npy' leaves the bundle"),
    ("/etc/passwd", None, r"field 'calibration.feature.centroid' path '/etc/passwd' leaves the bundle"),
    ("gone.npy", None, r"gone.npy: file named by field 'calibration.feature.centroid' .* is missing"),
    ("centroid.npy", np.ones(64, np.float32),
     r"field 'calibration.feature.centroid' .* holds float32 \[64\], not the 128 numbers of the encoder's feature"),
    ("centroid.npy", np.ones((128, 2), np.float32), r"holds float32 \[128, 2\], not the 128 numbers"),
    ("centroid.npy", np.zeros(128, np.float32), r"a centroid with a non-finite value or all zeros"),
    ("centroid.npy", np.full(128, np.nan, np.float32), r"a centroid with a non-finite value or all zeros"),
    ("centroid.npy", np.array(["x"] * 128), r"holds <U1 \[128\], not the 128 numbers"),
    ("centroid.npy", np.array([{"a": 1}] * 128, dtype=object), r"names a file that is not a NumPy .npy array"),
])
def test_a_bad_centroid_is_one_line(bundle_copy: Path, centroid: str, values, match: str) -> None:
    _with_feature(bundle_copy, centroid=centroid, values=values)
    _refused(bundle_copy, match)


def test_a_centroid_that_is_not_npy_or_not_a_file(bundle_copy: Path) -> None:
    _with_feature(bundle_copy, centroid="vocab.txt", values=None)
    _refused(bundle_copy, r"vocab.txt: field 'calibration.feature.centroid' .* names a file that is not a NumPy")
    (bundle_copy / "dir.npy").mkdir()
    _with_feature(bundle_copy, centroid="dir.npy", values=None)
    _refused(bundle_copy, r"field 'calibration.feature.centroid' of .* names a directory")


def test_the_cli_prints_one_line_and_exits_2(bundle_copy: Path) -> None:
    _edit(bundle_copy, lambda d: d.update(domain={"kind": "fantasy", "about": "x"}))
    proc = subprocess.run([sys.executable, "-m", "edgecap.cli", "validate", str(bundle_copy)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "field 'domain.kind' is 'fantasy': say 'synthetic'" in lines[0], proc.stderr


def test_validate_says_what_the_bundle_knows(bundle_copy: Path, capsys) -> None:
    from edgecap.cli import run

    assert run(["validate", str(REPO / "models" / "shapes_mobilenet_v1" / "bundle")]) == 0
    assert ("knows: synthetic (coloured circles" in (out := capsys.readouterr().out)
            and "unknown scene when confidence < -0.241876 or feature cosine < 0.623674" in out)
    _edit(bundle_copy, lambda d: [d.pop("domain", None), d.pop("calibration", None)])
    assert run(["validate", str(bundle_copy)]) == 0
    assert "knows: not declared (no 'domain'); no calibration: captions carry scene null" in capsys.readouterr().out


def test_the_scene_rule_is_either_threshold() -> None:
    centroid = np.zeros(4, np.float32)
    centroid[0] = 1.0
    calib = Calibration(Threshold(-0.1), FeatureThreshold(0.5, centroid=centroid))
    assert calib.scene(-0.01, np.array([2.0, 0.1, 0, 0])) == KNOWN
    assert calib.scene(-0.2, np.array([2.0, 0.1, 0, 0])) == UNKNOWN  # unsure
    assert calib.scene(-0.01, np.array([0.1, 2.0, 0, 0])) == UNKNOWN  # far from the centroid
    assert calib.scene(-0.01, np.zeros(4)) == UNKNOWN  # no feature at all is no scene it knows
    assert Calibration(Threshold(-0.1)).scene(-0.1) == KNOWN  # the threshold itself is in
