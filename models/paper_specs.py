"""The paper-scale bundles' backbones and what a built bundle is, without TensorFlow.

``models.paper_bundles`` builds from this table; keeping it free of
TensorFlow lets the default test suite check it and lets ``describe`` report
on a built bundle from the runtime's environment.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict

from models.bundle_meta import CAFFE_NORM, TF_NORM, InputNorm

# The RNN's hidden size. S2VT (Venugopalan et al., ICCV 2015) used 1000; 512
# is the other common size. 512 is chosen because the encoder LSTM step reads
# its whole float weight matrix, 4H(F+H+1) values, for every sampled frame:
# 21 MB at H=512 against 49 MB at H=1000 with F=2048, which on a board's CPU
# is memory traffic the CNN pipeline competes with at 59 fps (measured on
# this host: 9.6 against 23.6 ms per step, docs/bundle.md). --hidden 1000
# builds the original size.
DEFAULT_HIDDEN = 512


@dataclass(frozen=True)
class PaperBackbone:
    """One ``keras.applications`` architecture at its native input.

    Attributes:
      constructor: Name in ``keras.applications``.
      size: Native square input side.
      norm: Its ``preprocess_input`` convention.
      min_param_bytes: The int8 encoder's constant bytes must exceed this (0: no bound);
        the large ones exist to overflow one EdgeTPU's 8 MiB parameter cache.
    """

    constructor: str
    size: int
    norm: InputNorm
    min_param_bytes: int = 0


EDGETPU_SRAM = 8 << 20
PAPER_BACKBONES: Dict[str, PaperBackbone] = {
    "resnet50-224": PaperBackbone("ResNet50", 224, CAFFE_NORM, EDGETPU_SRAM),
    "inceptionv3-299": PaperBackbone("InceptionV3", 299, TF_NORM, EDGETPU_SRAM),
    "mobilenetv2-224": PaperBackbone("MobileNetV2", 224, TF_NORM),
}


def default_cache() -> Path:
    """Returns where the bundles are built: ``$EDGECAP_CACHE`` or ``~/.cache/edgecap``, plus ``bundles``."""
    root = os.environ.get("EDGECAP_CACHE") or os.path.join(Path.home(), ".cache", "edgecap")
    return Path(root) / "bundles"


@dataclass(frozen=True)
class BuiltBundle:
    """Sizes of a built bundle.

    Attributes:
      total_bytes: All files of the bundle.
      encoder_param_bytes: Constant tensors of the int8 encoder (weights, biases).
      hidden_size: The RNN's hidden size.
      feature_size: The encoder's feature size.
      weights: The bundle's ``weights`` field.
    """

    total_bytes: int
    encoder_param_bytes: int
    hidden_size: int
    feature_size: int
    weights: str


def inspect_built(bundle_dir: Path) -> BuiltBundle:
    """Reads a built bundle's sizes from its files."""
    from edgecap_compile.graph import read_graph

    meta = json.loads((bundle_dir / "bundle.json").read_text())
    graph = read_graph(bundle_dir / meta["encoder"])
    params = sum(t.nbytes for t in graph.tensors if t.constant)
    total = sum(p.stat().st_size for p in bundle_dir.rglob("*") if p.is_file())
    return BuiltBundle(total, params, meta["rnn"]["hidden_size"], meta["feature_size"],
                       meta.get("weights", "trained"))


def describe(bundle_dir: Path) -> str:
    """Returns one line on a built bundle: total size, encoder parameters, RNN and weights."""
    b = inspect_built(bundle_dir)
    return (f"{b.total_bytes / 1e6:.1f} MB, encoder params {b.encoder_param_bytes / (1 << 20):.2f} MiB, "
            f"feature {b.feature_size}, hidden {b.hidden_size}, weights {b.weights}")
