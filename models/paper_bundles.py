"""Builds the paper-scale bundles (ResNet50@224, InceptionV3@299, MobileNetV2@224) into a cache.

Each encoder is a ``keras.applications`` architecture at its native input,
pooled to its 2048 (1280 for MobileNetV2) features, full-int8; behind it the
demo's S2VT RNN (separate encoder and decoder LSTMs, state handed over)
scaled up to hidden 512, over the demo's vocabulary. The weights are random:
no package on PyPI ships the keras.applications ImageNet weights
(``keras.applications`` downloads them from storage.googleapis.com at run
time), so these bundles measure speed and exactness, not caption quality,
and say so (``"weights": "random"`` in bundle.json). They are 20-100 MB each:
built here, never committed.

Needs TensorFlow (``pip install -e .[train]``)::

    python -m models.paper_bundles --into ~/.cache/edgecap/bundles
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from models.paper_specs import PAPER_BACKBONES, DEFAULT_HIDDEN, default_cache, describe


def build(name: str, into: Path, hidden: int, calibration_frames: int, seed: int) -> Path:
    """Builds one paper-scale bundle into ``into/name`` (``name-hH`` for a hidden size H other
    than ``DEFAULT_HIDDEN``), replacing it whole when done.

    Args:
      name: A key of ``PAPER_BACKBONES``.
      into: Cache directory.
      hidden: The RNN's hidden size.
      calibration_frames: Frames of the demo clip the int8 ranges are measured on.
      seed: Seed of the random weights.

    Returns:
      The bundle directory.
    """
    import keras

    from models import backbones

    spec = PAPER_BACKBONES[name]
    start = time.monotonic()
    keras.utils.set_random_seed(seed)
    cnn = getattr(keras.applications, spec.constructor)(
        weights=None, include_top=False, pooling="avg", input_shape=(spec.size, spec.size, 3))
    source = backbones.pooled_encoder(cnn, spec.norm)
    vocab = backbones.demo_vocab()
    rnn = backbones.random_rnn(source.feature_size, hidden, len(vocab), seed)
    frames = backbones.calibration_frames(source, calibration_frames)
    backbones.fit_batchnorm(source, frames)
    into.mkdir(parents=True, exist_ok=True)
    # Another hidden size goes beside the default one rather than over it.
    final = into / (name if hidden == DEFAULT_HIDDEN else f"{name}-h{hidden}")
    # Built next to its final place and moved in whole: a reader never sees half a bundle.
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=into))
    try:
        backbones.build_bundle(
            tmp, f"edgecap-{name}-h{hidden}-random", source, rnn, vocab, "random", frames,
            {"recipe": f"python -m models.paper_bundles --into {into} --only {name} --hidden {hidden}",
             "seed": seed, "backbone": f"keras.applications.{spec.constructor}"
             f"(weights=None, include_top=False, pooling='avg', input_shape=({spec.size}, {spec.size}, 3))",
             "rnn": f"models.architectures.build_rnn, hidden {hidden}, random",
             "calibration": f"{len(frames)} frames of models/demo/sample.mp4, which also set "
                            "the batch-norm statistics of the random backbone",
             "build_seconds": None})
        meta_path = tmp / "bundle.json"
        meta = json.loads(meta_path.read_text())
        distinct = backbones.distinct_int8_features(tmp / meta["encoder"], frames)
        if distinct < 2:
            raise RuntimeError(f"{name}: the int8 encoder gives one feature vector for all "
                               f"{len(frames)} calibration frames: captions would be constant")
        meta["provenance"]["distinct_int8_features"] = f"{distinct} of {len(frames)} frames"
        meta["provenance"]["build_seconds"] = round(time.monotonic() - start)
        meta_path.write_text(json.dumps(meta, indent=2) + "\n")
        if final.exists():
            shutil.rmtree(final)
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the bundle from other users
        tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return final


def _main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m models.paper_bundles", description=__doc__.splitlines()[0])
    p.add_argument("--into", type=Path, default=default_cache(),
                   help="cache directory (default: $EDGECAP_CACHE/bundles or ~/.cache/edgecap/bundles)")
    p.add_argument("--only", nargs="+", choices=sorted(PAPER_BACKBONES), default=list(PAPER_BACKBONES),
                   help="bundles to build (default: all)")
    p.add_argument("--hidden", type=int, default=DEFAULT_HIDDEN, help="RNN hidden size")
    p.add_argument("--calibration-frames", type=int, default=8,
                   help="frames of the demo clip for int8 calibration")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for name in args.only:
        start = time.monotonic()
        path = build(name, args.into, args.hidden, args.calibration_frames, args.seed)
        print(f"{path}: {describe(path)} ({time.monotonic() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
