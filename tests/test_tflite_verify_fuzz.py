"""A bounded fuzz of the .tflite verifier: it raises its error, one line, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgecap.errors import BundleError
from edgecap.tflite_verify import verify_tflite

hypothesis = pytest.importorskip("hypothesis")  # the dev extra; a board's runtime tests may lack it
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

TINY = Path(__file__).resolve().parent / "data" / "runtime" / "tiny_encoder.tflite"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_raises_nothing_but_the_error(data) -> None:
    model = TINY.read_bytes()
    cut = data.draw(st.integers(0, len(model)))
    edits = data.draw(st.lists(st.tuples(st.integers(0, len(model) - 1), st.integers(0, 255)), max_size=8))
    b = bytearray(model[:cut] if data.draw(st.booleans()) else model)
    for pos, value in edits:
        if pos < len(b):
            b[pos] = value
    try:
        verify_tflite(bytes(b), "m.tflite")
    except BundleError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=2048))
def test_fuzz_arbitrary_bytes(blob: bytes) -> None:
    try:
        verify_tflite(blob, "m.tflite")
    except BundleError:
        pass
