"""Trains the demo's S2VT RNN on a fixed, already int8 frame encoder and writes a bundle.

    python -m models.train_frozen --encoder ENC.tflite --mean 128 128 128 --std 128 128 128 \\
        (--data DIR | --msvd CSV --videos DIR | --msrvtt JSON --videos DIR) \\
        --cache CACHE --out BUNDLE

The encoder is taken as it is (Coral's MobileNet v1 embedding extractor, the
EfficientNet-Lite0 of ``models.efficientnet_lite``, any full-integer TFLite
CNN with one frame in and one feature vector out) and goes into the bundle
byte for byte; only the RNN (``models.architectures.build_rnn``: encoder
LSTM, decoder LSTM, the demo's recipe) is trained, on the features of each
clip's first window as the runtime computes them, cached per video and
encoder (``models.feature_cache``). The figures on the test split come from
the bundle's own files through the runtime's captioner and are kept in
``bundle.json`` -> ``provenance.heldout``.

Needs TensorFlow (``pip install -e .[train]``).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np

from edgecap.dataset import Dataset, read_dataset
from edgecap.errors import ConfigError, EdgecapError
from edgecap.interpreter import make_cpu_interpreter
from models.bundle_meta import InputNorm
from models.feature_cache import FeatureCache, Window, first_window
from models.train import BOS, EOS, PAD, SPECIALS, UNK, encode_captions, tokenize
from models.video_datasets import read_msrvtt, read_msvd


def load_dataset(args: argparse.Namespace) -> Dataset:
    """Returns the dataset named by ``--data``, ``--msvd`` or ``--msrvtt`` (with ``--videos``)."""
    if args.msvd:
        return read_msvd(args.msvd, args.videos, args.language)
    if args.msrvtt:
        return read_msrvtt(args.msrvtt, args.videos)
    return read_dataset(args.data)


def frequent_vocab(captions: Sequence[str], min_count: int = 1) -> List[str]:
    """Returns the special tokens then, sorted, every word seen at least ``min_count`` times.

    A real corpus has a long tail of words seen once or twice (typos, names);
    they become ``<unk>`` rather than logits the decoder cannot learn.
    """
    counts = Counter(w for c in captions for w in tokenize(c))
    return list(SPECIALS) + sorted(w for w, n in counts.items() if n >= min_count)


def _progress(what: str):
    began = time.perf_counter()

    def report(done: int, total: int) -> None:
        if done == total or done % 200 == 0:
            print(f"  {what}: {done}/{total} clips, {time.perf_counter() - began:.0f} s", flush=True)
    return report


def _fit(rnn, features: np.ndarray, words_in: np.ndarray, targets: np.ndarray, args) -> None:
    import keras

    from models.train import _masked_caption_loss

    steps = -(-len(features) // args.batch) * args.epochs
    schedule = keras.optimizers.schedules.CosineDecay(args.lr, decay_steps=steps, alpha=0.05)
    rnn.compile(optimizer=keras.optimizers.Adam(schedule, clipnorm=1.0), loss=_masked_caption_loss)
    rnn.fit({"features": features, "words": words_in}, targets, batch_size=args.batch,
            epochs=args.epochs, shuffle=True, verbose=2)


def caption_test(bundle: Path, dataset: Dataset, ids: Sequence[str], window: Window) -> List[str]:
    """Captions each clip's first window with the runtime's captioner and the bundle's files."""
    from edgecap.captioner import EdgeCaptioner

    with EdgeCaptioner(bundle, pipelined=False, num_threads=1) as cap:
        return [cap.caption_frames(first_window(dataset.clip_path(i), window))[0].text for i in ids]


def _training_data(args: argparse.Namespace) -> Dataset:
    """Checks the encoder is a file and returns the dataset, which must have training clips.

    Bad input is refused here, before TensorFlow loads (seconds) or any clip is decoded.
    """
    if not Path(args.encoder).is_file():
        raise ConfigError(f"{args.encoder}: no such file (--encoder): give a full-integer "
                          "TFLite frame encoder")
    dataset = load_dataset(args)
    if not dataset.splits.get("train"):
        raise ConfigError(f"{args.data or args.msvd or args.msrvtt}: no clip in the 'train' "
                          "split: give a dataset with training clips")
    return dataset


def _heldout(bundle: Path, dataset: Dataset, test_ids: Sequence[str], window: Window) -> Dict[str, object]:
    """Captions the test clips with the written bundle; returns their figures and prints the first misses."""
    from models.heldout import exact_match

    captions = caption_test(bundle, dataset, test_ids, window)
    references = [dataset.captions[i] for i in test_ids]
    for pred, refs in [(p, r) for p, r in zip(captions, references) if p not in r][:10]:
        print(f"  miss: {pred!r} (expected {refs[0]!r})")
    return {"test_clips": len(test_ids), "exact_match_tflite": exact_match(captions, references)}


def train(args: argparse.Namespace) -> Dict[str, object]:
    """Runs the recipe (module docstring); returns the held-out figures."""
    began = time.perf_counter()
    dataset = _training_data(args)
    import keras
    import tensorflow as tf

    from models import export
    from models.architectures import ModelConfig, build_rnn

    keras.utils.set_random_seed(args.seed)
    tf.config.experimental.enable_op_determinism()
    norm = InputNorm(args.color_order, tuple(args.mean), tuple(args.std))
    window = Window(args.frames, args.sample_fps)
    cache = FeatureCache(args.cache, args.encoder, norm, window, num_threads=args.threads)
    train_ids = dataset.splits.get("train", [])[: args.train_clips or None]
    test_ids = dataset.splits.get("test", [])[: args.test_clips or None]
    samples = [(i, c) for i in train_ids for c in dataset.captions[i]]
    per_clip = cache.many([dataset.clip_path(i) for i in train_ids], _progress("train features"))
    row = {cid: k for k, cid in enumerate(train_ids)}
    features = per_clip[[row[i] for i, _ in samples]]
    vocab = frequent_vocab([c for _, c in samples], args.min_count)
    words_in, targets = encode_captions([c for _, c in samples], vocab, args.max_len)
    features_s = time.perf_counter() - began
    print(f"{len(samples)} training captions of {len(train_ids)} clips, vocab {len(vocab)}; "
          f"features: {cache.computed} computed, {cache.reused} reused from {cache.folder} "
          f"({features_s:.0f} s)", flush=True)

    size = int(make_cpu_interpreter(Path(args.encoder)).get_input_details()[0]["shape"][1])
    config = ModelConfig(input_size=size, feature_size=int(features.shape[-1]),
                         hidden_size=args.hidden_size, embed_size=args.embed_size,
                         window_frames=window.frames, max_caption_length=args.max_len)
    rnn = build_rnn(config, len(vocab))
    _fit(rnn, features, words_in, targets, args)
    trained_s = time.perf_counter() - began - features_s

    encoder = Path(args.encoder).read_bytes()
    models = {"encoder": encoder, **export.step_models(rnn, config)}
    provenance: Dict[str, object] = {
        "recipe": "python -m models.train_frozen " + " ".join(args.argv),
        "seed": args.seed,
        "encoder_source": Path(args.encoder).name,
        "encoder_sha256": hashlib.sha256(encoder).hexdigest(),
        "train_captions": len(samples),
    }
    tokens = dict(zip(("pad", "bos", "eos", "unk"), (PAD, BOS, EOS, UNK)))
    # "trained": the captions mean something; the note says what was trained.
    extra = {"weights": "trained", "weights_note": "pretrained encoder taken as it is; decoder "
             "trained on captions of its features"}
    out = Path(args.out)
    export.write_bundle(out, args.name, config, vocab, models, window.sample_fps, tokens,
                        provenance, norm=norm, extra=extra)
    figures: Dict[str, object] = {"train_clips": len(train_ids),
                                  "features_computed": cache.computed,
                                  "features_reused": cache.reused,
                                  "features_seconds": round(features_s),
                                  "train_seconds": round(trained_s)}
    if test_ids:
        figures.update(_heldout(out, dataset, test_ids, window))
    figures["total_seconds"] = round(time.perf_counter() - began)
    provenance["heldout"] = figures
    export.write_bundle(out, args.name, config, vocab, models, window.sample_fps, tokens,
                        provenance, norm=norm, extra=extra)
    for key, value in figures.items():
        print(f"{key:24s} {value:.4f}" if isinstance(value, float) else f"{key:24s} {value}")
    return figures


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parses the command line (``python -m models.train_frozen --help``)."""
    p = argparse.ArgumentParser(prog="python -m models.train_frozen", description=__doc__.split("\n")[0])
    p.add_argument("--encoder", type=Path, required=True, help="full-integer TFLite frame encoder")
    p.add_argument("--mean", type=float, nargs=3, default=(127.5,) * 3,
                   help="per-channel mean the encoder's input expects (128 128 128 for Coral's "
                        "uint8 models: raw pixels)")
    p.add_argument("--std", type=float, nargs=3, default=(127.5,) * 3)
    p.add_argument("--color-order", choices=("RGB", "BGR"), default="RGB")
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--data", type=Path, help="dataset in edgecap's layout (models/README.md)")
    data.add_argument("--msvd", type=Path, help="MSVD's 'MSR Video Description Corpus.csv'")
    data.add_argument("--msrvtt", type=Path, help="MSR-VTT's train_val_videodatainfo.json")
    p.add_argument("--videos", type=Path, help="folder of the corpus's clips (with --msvd/--msrvtt)")
    p.add_argument("--language", default="English", help="MSVD descriptions to keep")
    p.add_argument("--cache", type=Path, required=True, help="feature cache folder (reused across runs)")
    p.add_argument("--out", type=Path, required=True, help="bundle directory to write")
    p.add_argument("--name", default="edgecap-frozen-encoder", help="bundle name")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--embed-size", type=int, default=64)
    p.add_argument("--max-len", type=int, default=8, help="most words in a caption")
    p.add_argument("--min-count", type=int, default=1,
                   help="words seen fewer times in the training captions become <unk>")
    p.add_argument("--frames", type=int, default=8, help="sampled frames per window")
    p.add_argument("--sample-fps", type=float, default=8.0)
    p.add_argument("--train-clips", type=int, default=0, help="use the first N (0: all)")
    p.add_argument("--test-clips", type=int, default=0, help="use the first N (0: all)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    args.argv = list(argv)
    return args


def main(argv: Sequence[str]) -> int:
    """Command-line entry point; bad input is one line and exit 2."""
    args = parse_args(argv)
    try:
        if (args.msvd or args.msrvtt) and args.videos is None:
            raise ConfigError(f"{args.msvd or args.msrvtt}: --msvd and --msrvtt need --videos, "
                              "the folder of the corpus's clips")
        train(args)
    except (EdgecapError, OSError) as e:
        print(f"python -m models.train_frozen: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
