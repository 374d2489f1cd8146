"""A bundle's domain and in-domain confidence calibration (models/domain.py)."""

from __future__ import annotations

import json

import pytest

from models import domain


def test_calibration_is_the_low_percentile_of_heldout_confidences():
    values = [-0.001 * i for i in range(101)]  # 0 .. -0.1
    calib = domain.calibration(values)
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
    domain.write_fields(bundle, domain.SYNTHETIC_SHAPES, domain.calibration([-0.01, -0.02]))
    meta = json.loads((bundle / "bundle.json").read_text())
    assert meta["domain"]["kind"] == "synthetic" and "unknown_below" in meta["calibration"]
    assert load_bundle(bundle).meta["domain"] == meta["domain"]
