"""The int8 export that every fixture goes through reproduces the checked-in runtime fixture."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.tf

GENERATOR = Path(__file__).parent / "data" / "runtime" / "make_tiny_encoder.py"


def test_export_int8_regenerates_the_tiny_encoder_byte_for_byte():
    tf = pytest.importorskip("tensorflow")
    from edgecap_compile.int8_export import export_int8

    spec = importlib.util.spec_from_file_location("make_tiny_encoder", GENERATOR)
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    tf.keras.utils.set_random_seed(0)
    data = export_int8(generator.build(), (16, 16, 3), samples=32)
    assert data == (GENERATOR.parent / "tiny_encoder.tflite").read_bytes()
