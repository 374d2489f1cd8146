"""Builds the paper-scale bundles (ResNet50@224, InceptionV3@299, MobileNetV2@224) into a cache.

Each encoder is a ``keras.applications`` architecture at its native input,
pooled to its 2048 (1280 for MobileNetV2) features, full-int8; behind it the
demo's S2VT RNN (separate encoder and decoder LSTMs, state handed over)
scaled up to hidden 512, over the demo's vocabulary. The weights are random:
no package on PyPI ships the keras.applications ImageNet weights
(``keras.applications`` downloads them from storage.googleapis.com at run
time), so these bundles measure speed and exactness, not caption quality,
and say so (``"weights": "random"`` in bundle.json). They are 26-54 MB each
(105 MB for ResNet50 at ``--hidden 1000``): built here, never committed.

Needs TensorFlow (``pip install -e .[train]``)::

    python -m models.paper_bundles --into ~/.cache/edgecap/bundles
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from edgecap.command import run_command
from edgecap.errors import BundleError, ConfigError, EdgecapError
from edgecap.outputs import check_output
from models.paper_specs import PAPER_BACKBONES, DEFAULT_HIDDEN, default_cache, describe

PROG = "python -m models.paper_bundles"


def build(name: str, into: Path, hidden: int, calibration_frames: int, seed: int) -> Path:
    """Builds one paper-scale bundle into ``into/name`` (``name-hH`` for a hidden size H other
    than ``DEFAULT_HIDDEN``), replacing it whole when done.

    Args:
      name: A key of ``PAPER_BACKBONES``.
      into: Cache directory, created if missing (its parent must exist).
      hidden: The RNN's hidden size.
      calibration_frames: Frames of the demo clip the int8 ranges are measured on, at least 2.
      seed: Seed of the random weights.

    Returns:
      The bundle directory.

    Raises:
      BundleError: If the int8 encoder gives one feature vector for every calibration frame.
    """
    import keras

    from models import backbones

    spec = PAPER_BACKBONES[name]
    start = time.monotonic()
    into.mkdir(exist_ok=True)  # before the minutes of Keras work, so that a bad place fails first
    # Another hidden size goes beside the default one rather than over it.
    final = into / (name if hidden == DEFAULT_HIDDEN else f"{name}-h{hidden}")
    with backbones.staged_dir(final) as tmp:
        keras.utils.set_random_seed(seed)
        cnn = getattr(keras.applications, spec.constructor)(
            weights=None, include_top=False, pooling="avg", input_shape=(spec.size, spec.size, 3))
        source = backbones.pooled_encoder(cnn, spec.norm)
        vocab = backbones.demo_vocab()
        rnn = backbones.random_rnn(source.feature_size, hidden, len(vocab), seed)
        frames = backbones.calibration_frames(source, calibration_frames)
        backbones.fit_batchnorm(source, frames)
        backbones.build_bundle(
            tmp, f"edgecap-{name}-h{hidden}-random", source, rnn, vocab, "random", frames,
            {"recipe": f"{PROG} --into {into} --only {name} --hidden {hidden}",
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
            raise BundleError(f"{name}: the int8 encoder gives one feature vector for all "
                              f"{len(frames)} calibration frames, so captions would be constant: "
                              "try another --seed or more --calibration-frames")
        meta["provenance"]["distinct_int8_features"] = f"{distinct} of {len(frames)} frames"
        meta["provenance"]["build_seconds"] = round(time.monotonic() - start)
        meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return final


def check_args(args: argparse.Namespace) -> Path:
    """Checks the arguments and the cache directory before any model is built.

    Args:
      args: Parsed arguments; ``into`` None means the default cache.

    Returns:
      The cache directory.

    Raises:
      ConfigError: If a number is out of range or the cache directory cannot be written.
    """
    if args.hidden < 1:
        raise ConfigError(f"--hidden {args.hidden}: the RNN needs at least 1 unit "
                          f"(default {DEFAULT_HIDDEN}; S2VT used 1000)")
    if args.calibration_frames < 2:
        # One frame cannot show that the int8 features vary from frame to frame.
        raise ConfigError(f"--calibration-frames {args.calibration_frames}: give at least 2 (default 8)")
    if not 0 <= args.seed < 2 ** 32:
        raise ConfigError(f"--seed {args.seed}: give a seed from 0 to 2**32 - 1")
    into: Optional[Path] = args.into
    if into is None:
        into = default_cache()
        # The default cache is edgecap's own: its parents are made; a given --into's are not.
        try:
            into.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{into.parent}: cannot create the cache ({e.strerror}): "
                              "pass --into a directory you can write") from None
    return check_output(into, "--into", directory=True)


def _main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--into", type=Path,
                   help="cache directory, created if missing (default: $EDGECAP_CACHE/bundles "
                        "or ~/.cache/edgecap/bundles)")
    p.add_argument("--only", nargs="+", choices=sorted(PAPER_BACKBONES), default=list(PAPER_BACKBONES),
                   help="bundles to build (default: all)")
    p.add_argument("--hidden", type=int, default=DEFAULT_HIDDEN, help="RNN hidden size")
    p.add_argument("--calibration-frames", type=int, default=8,
                   help="frames of the demo clip for int8 calibration (at least 2)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    def body() -> int:
        try:
            into = check_args(args)
            for name in args.only:
                start = time.monotonic()
                path = build(name, into, args.hidden, args.calibration_frames, args.seed)
                print(f"{path}: {describe(path)} ({time.monotonic() - start:.0f} s)", flush=True)
        except ModuleNotFoundError as e:
            raise EdgecapError(f"{e.name} is not installed: pip install -e .[train]") from None
        except OSError as e:  # e.g. the disk filled: the bundle being built was removed
            raise EdgecapError(str(e)) from None
        return 0

    return run_command(PROG, body)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
