"""The second example bundle (models/shapes_mobilenet_v1): Coral's embedding extractor as published, a trained RNN."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from edgecap.bundle import load_bundle
from edgecap.captioner import EdgeCaptioner
from edgecap.interpreter import make_cpu_interpreter

BUNDLE = Path(__file__).resolve().parents[1] / "models" / "shapes_mobilenet_v1" / "bundle"
SAMPLE = Path(__file__).resolve().parents[1] / "models" / "demo" / "sample.mp4"
# sha256 of mobilenet_v1_1.0_224_quant_embedding_extractor.tflite in google-coral/test_data 104342d2.
CORAL_EXTRACTOR_SHA256 = "f409ef4f73fcbb9667841965623c5c8524aac33d41b9bf5f3667161fb4a76319"


def test_the_encoder_is_corals_extractor_byte_for_byte_with_uint8_io():
    meta = json.loads((BUNDLE / "bundle.json").read_text())
    data = (BUNDLE / meta["encoder"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == CORAL_EXTRACTOR_SHA256
    assert meta["provenance"]["encoder_sha256"] == CORAL_EXTRACTOR_SHA256
    interp = make_cpu_interpreter(BUNDLE / meta["encoder"])
    (inp,), (out,) = interp.get_input_details(), interp.get_output_details()
    assert inp["dtype"] == np.uint8 and out["dtype"] == np.uint8
    assert list(out["shape"]) == [1, 1, 1, 1024]  # taken as it is, not reshaped
    assert sum(f.stat().st_size for f in BUNDLE.iterdir()) < 15 * 2**20


def test_it_validates_and_captions_the_sample_clip_in_the_demo_vocabulary():
    bundle = load_bundle(BUNDLE)
    assert bundle.feature_size == 1024
    vocab = set((BUNDLE / "vocab.txt").read_text().split())
    with EdgeCaptioner(BUNDLE, pipelined=False, num_threads=1) as cap:
        captions = [c.text for c in cap.stream(str(SAMPLE))]
    assert len(captions) == 3
    assert all(c.split() and set(c.split()) <= vocab for c in captions)
