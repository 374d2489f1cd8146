"""A bundle's domain and in-domain confidence calibration (models/domain.py)."""

from __future__ import annotations

import json

import pytest

from models import domain


def test_calibration_is_the_low_percentile_of_heldout_confidences():
    values = [-0.001 * i for i in range(101)]  # 0 .. -0.1
    calib = domain.calibration(values, 5.0)
    assert calib["unknown_below"] == pytest.approx(-0.095)
    assert calib["heldout_windows"] == 101
    assert domain.unknown_share(values, calib["unknown_below"]) == pytest.approx(5 / 101)


@pytest.mark.parametrize("bad", [[], [0.1], [float("nan")]])
def test_calibration_refuses_what_is_not_a_confidence(bad):
    with pytest.raises(ValueError):
        domain.calibration(bad)


def test_fields_are_written_beside_the_rest_and_the_bundle_still_loads(tmp_path):
    import shutil

    from edgecap.bundle import load_bundle

    bundle = tmp_path / "b"
    shutil.copytree("models/demo/bundle", bundle)
    domain.write_fields(bundle, domain.SYNTHETIC_SHAPES, {"confidence": domain.calibration([-0.01, -0.02])})
    meta = json.loads((bundle / "bundle.json").read_text())
    assert meta["domain"]["kind"] == "synthetic" and "unknown_below" in meta["calibration"]["confidence"]
    assert load_bundle(bundle).meta["domain"] == meta["domain"]


def test_feature_calibration_is_the_low_percentile_of_cosines_to_the_centroid():
    import numpy as np

    rng = np.random.default_rng(0)
    inside = rng.normal(1.0, 0.1, (200, 8))
    calib = domain.feature_calibration(inside, 5.0)
    assert len(calib["centroid"]) == 8 and 0.9 < calib["unknown_below"] < 1.0
    centroid = np.asarray(calib["centroid"])
    assert np.mean(domain.cosines(inside, centroid) < calib["unknown_below"]) == pytest.approx(0.05, abs=0.01)
    outside = rng.normal(0.0, 1.0, (50, 8))
    assert np.mean(domain.cosines(outside, centroid) < calib["unknown_below"]) > 0.9
