"""Training and full-integer export recipe for an edgecap bundle.

    python -m models.train --data DATA_DIR --out BUNDLE_DIR --seed 0

1. End-to-end training on caption windows: per-frame CNN, encoder LSTM, decoder
   LSTM with teacher forcing, plus a per-frame bag-of-words loss on the CNN
   features that gives the CNN a direct signal early on.
2. Int8 export of the CNN, calibrated on training frames.
3. Fine-tuning of the RNN alone on the int8 encoder's features mixed with the
   float ones, so int8 and float features yield the same captions.
4. Export of the step models, vocab and bundle.json; greedy captions of the
   test split from the exported files, printed and recorded in provenance.

Same data, seed and arguments give the same bundle (op determinism is on).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import cv2
import numpy as np

from models.dataset import Dataset, read_dataset, read_video, sample_window

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD, BOS, EOS, UNK = range(len(SPECIALS))
SAMPLE_FPS = 8.0


def tokenize(caption: str) -> List[str]:
    """Lower-cases a caption and splits it into words, dropping punctuation."""
    return re.findall(r"[a-z0-9']+", caption.lower())


def build_vocab(captions: Sequence[str]) -> List[str]:
    """Returns the special tokens then every word of ``captions``, sorted."""
    words = sorted({w for c in captions for w in tokenize(c)})
    return list(SPECIALS) + words


def encode_captions(
    captions: Sequence[str], vocab: Sequence[str], max_len: int
) -> Tuple[np.ndarray, np.ndarray]:
    """Turns captions into teacher-forcing inputs and targets.

    Returns:
      ``(words_in, targets)``, both ``[B, max_len+1] int32``: bos + words, and
      words + eos, padded with pad; longer captions are cut to ``max_len`` words.
    """
    index = {w: i for i, w in enumerate(vocab)}
    words_in = np.full((len(captions), max_len + 1), PAD, np.int32)
    targets = np.full_like(words_in, PAD)
    for row, caption in enumerate(captions):
        ids = [index.get(w, UNK) for w in tokenize(caption)][:max_len]
        words_in[row, : len(ids) + 1] = [BOS] + ids
        targets[row, : len(ids) + 1] = ids + [EOS]
    return words_in, targets


def load_windows(
    dataset: Dataset, ids: Sequence[str], frames: int, size: int, sample_fps: float
) -> np.ndarray:
    """Decodes each clip's first window as the runtime samples it: RGB uint8 ``[B,N,S,S,3]``.

    Frames are resized with ``cv2.INTER_AREA``, the runtime's resize.
    """
    out = np.empty((len(ids), frames, size, size, 3), np.uint8)
    for i, clip_id in enumerate(ids):
        video, fps = read_video(dataset.clip_path(clip_id))
        for j, frame in enumerate(sample_window(video, fps or dataset.fps, sample_fps, frames)):
            small = cv2.resize(frame, (size, size), interpolation=cv2.INTER_AREA)
            out[i, j] = cv2.cvtColor(small, cv2.COLOR_BGR2RGB)
    return out


def _masked_caption_loss(targets, logits):
    import keras
    from keras import ops

    ce = keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True)
    mask = ops.cast(ops.not_equal(targets, PAD), ce.dtype)
    return ops.sum(ce * mask) / ops.maximum(ops.sum(mask), 1.0)


def _bag_targets(targets: np.ndarray, vocab_size: int, frames: int) -> np.ndarray:
    """Multi-hot of each caption's words (no specials), repeated for every frame."""
    bag = np.zeros((len(targets), vocab_size), np.float32)
    rows = np.repeat(np.arange(len(targets)), targets.shape[1])
    bag[rows, targets.ravel()] = 1.0
    bag[:, : len(SPECIALS)] = 0.0
    return np.repeat(bag[:, None, :], frames, axis=1)


def _decode(tokens: np.ndarray, vocab: Sequence[str]) -> List[str]:
    out = []
    for row in tokens:
        words = []
        for t in row:
            if t == EOS:
                break
            words.append(vocab[t])
        out.append(" ".join(words))
    return out


def train(args: argparse.Namespace) -> Dict[str, object]:
    """Runs the whole recipe; returns the held-out figures."""
    import keras
    import tensorflow as tf

    from models import export, heldout
    from models.architectures import (
        ModelConfig,
        build_captioner,
        build_frame_encoder,
        build_rnn,
        greedy_decode,
    )

    keras.utils.set_random_seed(args.seed)
    tf.config.experimental.enable_op_determinism()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    began = time.perf_counter()

    config = ModelConfig(
        feature_size=args.feature_size,
        width=args.width,
        hidden_size=args.hidden_size,
        max_caption_length=args.max_len,
    )
    dataset = read_dataset(args.data)
    train_ids = dataset.splits["train"][: args.train_clips or None]
    test_ids = dataset.splits["test"][: args.test_clips or None]
    vocab = build_vocab([c for i in train_ids for c in dataset.captions[i]])
    # A clip with several references contributes one sample per reference.
    samples = [(i, c) for i in train_ids for c in dataset.captions[i]]
    frames = load_windows(dataset, [i for i, _ in samples], config.window_frames,
                          config.input_size, SAMPLE_FPS)
    words_in, targets = encode_captions([c for _, c in samples], vocab, config.max_caption_length)
    test_frames = load_windows(dataset, test_ids, config.window_frames, config.input_size, SAMPLE_FPS)
    print(f"loaded {len(samples)} training and {len(test_ids)} test windows, "
          f"vocab {len(vocab)}, in {time.perf_counter() - began:.0f} s", flush=True)

    cnn = build_frame_encoder(config)
    rnn = build_rnn(config, len(vocab))
    model = build_captioner(cnn, rnn, config, len(vocab))
    steps_per_epoch = -(-len(samples) // args.batch)
    schedule = keras.optimizers.schedules.CosineDecay(
        args.lr, decay_steps=steps_per_epoch * args.epochs, alpha=0.05
    )
    model.compile(
        optimizer=keras.optimizers.Adam(schedule, clipnorm=1.0),
        loss={
            "caption": _masked_caption_loss,
            "bag": keras.losses.BinaryCrossentropy(from_logits=True),
        },
        loss_weights={"caption": 1.0, "bag": args.bag_weight},
    )
    model.fit(
        {"frames": frames, "words": words_in},
        {"caption": targets, "bag": _bag_targets(targets, len(vocab), config.window_frames)},
        batch_size=args.batch,
        epochs=args.epochs,
        shuffle=True,
        verbose=2,
    )
    trained_s = time.perf_counter() - began

    normalise = lambda x: (x.astype(np.float32) - export.PIXEL_MEAN) / export.PIXEL_STD  # noqa: E731
    calib_rng = np.random.default_rng(args.seed)
    flat = frames.reshape((-1,) + frames.shape[2:])
    calibration = normalise(flat[calib_rng.choice(len(flat), args.calibration_frames, replace=False)])
    models = {
        "encoder": export.int8_encoder(cnn, config.input_size, calibration),
        "reference_encoder": export.float_encoder(cnn, config.input_size),
    }

    def cnn_features(x: np.ndarray) -> np.ndarray:
        flat_x = normalise(x.reshape((-1,) + x.shape[2:]))
        return cnn.predict(flat_x, batch_size=256, verbose=0).reshape(x.shape[:2] + (-1,))

    if args.finetune_epochs:
        int8_encoder = heldout.FrameEncoder(models["encoder"], [export.PIXEL_MEAN] * 3,
                                            [export.PIXEL_STD] * 3)
        mixed = np.concatenate([cnn_features(frames), int8_encoder.windows(frames)])
        rnn.compile(optimizer=keras.optimizers.Adam(args.lr * 0.1, clipnorm=1.0),
                    loss=_masked_caption_loss)
        rnn.fit({"features": mixed, "words": np.concatenate([words_in, words_in])},
                np.concatenate([targets, targets]), batch_size=args.batch,
                epochs=args.finetune_epochs, shuffle=True, verbose=2)

    models.update(export.step_models(rnn, config))
    float_captions = _decode(
        greedy_decode(rnn, cnn_features(test_frames), BOS, config.max_caption_length + 1).numpy(),
        vocab,
    )
    references = [dataset.captions[i] for i in test_ids]
    provenance: Dict[str, object] = {
        "recipe": "python -m models.train " + " ".join(args.argv),
        "seed": args.seed,
        "data": str(Path(args.data).name),
        "train_windows": len(samples),
    }
    export.write_bundle(Path(args.out), args.name, config, vocab, models, SAMPLE_FPS,
                        dict(zip(("pad", "bos", "eos", "unk"), (PAD, BOS, EOS, UNK))), provenance)

    int8_pipe = heldout.TfliteCaptioner(Path(args.out))
    float_pipe = heldout.TfliteCaptioner(Path(args.out), reference=True)
    int8_captions = [int8_pipe.caption(w) for w in test_frames]
    ref_captions = [float_pipe.caption(w) for w in test_frames]
    figures = {
        "test_windows": len(test_ids),
        "exact_match_keras_float": heldout.exact_match(float_captions, references),
        "exact_match_tflite_float": heldout.exact_match(ref_captions, references),
        "exact_match_tflite_int8": heldout.exact_match(int8_captions, references),
        "int8_float_agreement": float(np.mean([a == b for a, b in zip(int8_captions, ref_captions)])),
        "train_seconds": round(trained_s),
        "total_seconds": round(time.perf_counter() - began),
    }
    provenance["heldout"] = figures
    export.write_bundle(Path(args.out), args.name, config, vocab, models, SAMPLE_FPS,
                        dict(zip(("pad", "bos", "eos", "unk"), (PAD, BOS, EOS, UNK))), provenance)
    for key, value in figures.items():
        print(f"{key:28s} {value:.4f}" if isinstance(value, float) else f"{key:28s} {value}")
    misses = [(p, r[0]) for p, r in zip(int8_captions, references) if p not in r][:10]
    for pred, ref in misses:
        print(f"  miss: {pred!r} (expected {ref!r})")
    return figures


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m models.train", description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="dataset directory (clips/ + captions.json)")
    parser.add_argument("--out", required=True, help="bundle directory to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="edgecap-demo-shapes", help="bundle name")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--finetune-epochs", type=int, default=3,
                        help="RNN-only epochs on mixed int8/float features (0: none)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--bag-weight", type=float, default=0.5)
    parser.add_argument("--width", type=float, default=1.0, help="CNN channel multiplier")
    parser.add_argument("--feature-size", type=int, default=128)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--max-len", type=int, default=8, help="most words in a caption")
    parser.add_argument("--train-clips", type=int, default=0, help="use the first N (0: all)")
    parser.add_argument("--test-clips", type=int, default=0, help="use the first N (0: all)")
    parser.add_argument("--calibration-frames", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    args.argv = list(argv)
    return args


def main(argv: Sequence[str]) -> int:
    """Command-line entry point; see the module docstring."""
    train(_parse(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
