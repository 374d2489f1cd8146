"""Training and full-integer export recipe for an edgecap bundle.

    python -m models.train --data DATA_DIR --out BUNDLE_DIR --seed 0

1. End-to-end training on caption windows: per-frame CNN, encoder LSTM, decoder
   LSTM with teacher forcing, plus per-frame auxiliary losses on the CNN
   features: bag-of-words, which gives the CNN a direct signal early on, and,
   where the dataset annotates it, the object's orientation, without which the
   features do not carry the angle a rotation's direction is read from.
2. Int8 export of the CNN, calibrated on training frames.
3. Fine-tuning of the RNN alone on the int8 encoder's features mixed with the
   float ones, so int8 and float features yield the same captions.
4. Export of the step models, vocab and bundle.json; captions of the test
   split from the exported files by the runtime's decoder (its default beam),
   printed and recorded in provenance.

Seeded, with op determinism on: small runs repeat bit for bit, full-size runs
on this host do not (models/README.md).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import cv2
import numpy as np

from edgecap.dataset import Dataset, read_dataset
from models.dataset import read_video, sample_indices, sample_window

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


def orientation_targets(
    dataset: Dataset, ids: Sequence[str], frames: int, sample_fps: float
) -> np.ndarray:
    """Per sampled frame, the annotated angle on the circle of its symmetry period.

    Returns:
      ``[B,N,3] float32``: ``(cos, sin, 1)``, or zeros (masked out) for a clip
      with no orientation annotation.
    """
    out = np.zeros((len(ids), frames, 3), np.float32)
    for i, clip_id in enumerate(ids):
        note = dataset.orientation.get(clip_id)
        if note is None:
            continue
        if not dataset.fps:
            raise ValueError(f"{dataset.root}: orientation annotations need the dataset's fps")
        angles = np.asarray(note["angles_deg"], np.float64)
        idx = sample_indices(len(angles), dataset.fps, sample_fps, frames)
        phase = 2 * np.pi * angles[idx] / float(note["period_deg"])
        out[i] = np.stack([np.cos(phase), np.sin(phase), np.ones_like(phase)], axis=1)
    return out


def _masked_orientation_loss(targets, predicted):
    from keras import ops

    mask = targets[..., 2]
    error = ops.sum(ops.square(targets[..., :2] - predicted), axis=-1)
    return ops.sum(error * mask) / ops.maximum(ops.sum(mask), 1.0)


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


@dataclass
class Windows:
    """Caption windows ready for training: one row per (clip, reference caption).

    Attributes:
      frames: RGB uint8 ``[B,N,S,S,3]``.
      words_in: Teacher-forcing inputs ``[B,L+1]``.
      targets: Next-word targets ``[B,L+1]``.
      orientation: Per-frame orientation targets ``[B,N,3]`` (``orientation_targets``).
    """

    frames: np.ndarray
    words_in: np.ndarray
    targets: np.ndarray
    orientation: np.ndarray


def _normalise(x: np.ndarray) -> np.ndarray:
    from models.export import PIXEL_MEAN, PIXEL_STD

    return (x.astype(np.float32) - PIXEL_MEAN) / PIXEL_STD


def _cnn_features(cnn, windows: np.ndarray) -> np.ndarray:
    flat = _normalise(windows.reshape((-1,) + windows.shape[2:]))
    return cnn.predict(flat, batch_size=256, verbose=0).reshape(windows.shape[:2] + (-1,))


def _fit_end_to_end(cnn, rnn, config, vocab_size: int, data: Windows, args) -> None:
    import keras

    from models.architectures import build_captioner

    model = build_captioner(cnn, rnn, config, vocab_size)
    steps_per_epoch = -(-len(data.frames) // args.batch)
    schedule = keras.optimizers.schedules.CosineDecay(
        args.lr, decay_steps=steps_per_epoch * args.epochs, alpha=0.05
    )
    model.compile(
        optimizer=keras.optimizers.Adam(schedule, clipnorm=1.0),
        loss={"caption": _masked_caption_loss,
              "bag": keras.losses.BinaryCrossentropy(from_logits=True),
              "orientation": _masked_orientation_loss},
        loss_weights={"caption": 1.0, "bag": args.bag_weight,
                      "orientation": args.orientation_weight},
    )
    model.fit(
        {"frames": data.frames, "words": data.words_in},
        {"caption": data.targets,
         "bag": _bag_targets(data.targets, vocab_size, config.window_frames),
         "orientation": data.orientation},
        batch_size=args.batch, epochs=args.epochs, shuffle=True, verbose=2,
    )


def _finetune_rnn_on_int8(cnn, rnn, int8_encoder: bytes, data: Windows, args) -> None:
    import keras

    from models.export import PIXEL_MEAN, PIXEL_STD
    from models.heldout import FrameEncoder

    quantized = FrameEncoder(int8_encoder, [PIXEL_MEAN] * 3, [PIXEL_STD] * 3).windows(data.frames)
    features = np.concatenate([_cnn_features(cnn, data.frames), quantized])
    rnn.compile(optimizer=keras.optimizers.Adam(args.lr * 0.1, clipnorm=1.0),
                loss=_masked_caption_loss)
    rnn.fit({"features": features, "words": np.concatenate([data.words_in, data.words_in])},
            np.concatenate([data.targets, data.targets]), batch_size=args.batch,
            epochs=args.finetune_epochs, shuffle=True, verbose=2)


def train(args: argparse.Namespace) -> Dict[str, object]:
    """Runs the whole recipe (see the module docstring); returns the held-out figures."""
    import keras
    import tensorflow as tf

    from models import export, heldout
    from models.architectures import ModelConfig, build_frame_encoder, build_rnn, greedy_decode

    keras.utils.set_random_seed(args.seed)
    tf.config.experimental.enable_op_determinism()
    try:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        # TensorFlow already ran in this process (another test, a notebook): its
        # thread pools are fixed; training still runs, only --threads is ignored.
        print("TensorFlow already initialised: --threads ignored", file=sys.stderr)
    began = time.perf_counter()

    config = ModelConfig(feature_size=args.feature_size, width=args.width,
                         hidden_size=args.hidden_size, max_caption_length=args.max_len)
    dataset = read_dataset(args.data)
    train_ids = dataset.splits["train"][: args.train_clips or None]
    test_ids = dataset.splits["test"][: args.test_clips or None]
    vocab = build_vocab([c for i in train_ids for c in dataset.captions[i]])
    # A clip with several references contributes one sample per reference.
    samples = [(i, c) for i in train_ids for c in dataset.captions[i]]
    data = Windows(
        load_windows(dataset, [i for i, _ in samples], config.window_frames, config.input_size,
                     SAMPLE_FPS),
        *encode_captions([c for _, c in samples], vocab, config.max_caption_length),
        orientation_targets(dataset, [i for i, _ in samples], config.window_frames, SAMPLE_FPS),
    )
    test_frames = load_windows(dataset, test_ids, config.window_frames, config.input_size, SAMPLE_FPS)
    print(f"loaded {len(samples)} training and {len(test_ids)} test windows, "
          f"vocab {len(vocab)}, in {time.perf_counter() - began:.0f} s", flush=True)

    cnn = build_frame_encoder(config)
    rnn = build_rnn(config, len(vocab))
    _fit_end_to_end(cnn, rnn, config, len(vocab), data, args)
    trained_s = time.perf_counter() - began

    flat = data.frames.reshape((-1,) + data.frames.shape[2:])
    picks = np.random.default_rng(args.seed).choice(len(flat), args.calibration_frames, replace=False)
    models = {
        "encoder": export.int8_encoder(cnn, config.input_size, _normalise(flat[picks])),
        "reference_encoder": export.float_encoder(cnn, config.input_size),
    }
    if args.finetune_epochs:
        _finetune_rnn_on_int8(cnn, rnn, models["encoder"], data, args)
    models.update(export.step_models(rnn, config))

    keras_captions = _decode(
        greedy_decode(rnn, _cnn_features(cnn, test_frames), BOS,
                      config.max_caption_length + 1).numpy(),
        vocab,
    )
    provenance: Dict[str, object] = {
        "recipe": "python -m models.train " + " ".join(args.argv),
        "seed": args.seed,
        "data": str(Path(args.data).name),
        "train_windows": len(samples),
        "orientation_windows": int(data.orientation[:, 0, 2].sum()),
    }
    tokens = dict(zip(("pad", "bos", "eos", "unk"), (PAD, BOS, EOS, UNK)))
    out = Path(args.out)
    # Written twice: the held-out check reads the exported files back, and its
    # figures then go into the provenance.
    export.write_bundle(out, args.name, config, vocab, models, SAMPLE_FPS, tokens, provenance)
    int8_captions = heldout.caption_windows(out, test_frames)
    float_captions = heldout.caption_windows(out, test_frames, reference=True)
    references = [dataset.captions[i] for i in test_ids]
    figures = {
        "test_windows": len(test_ids),
        "exact_match_keras_float": heldout.exact_match(keras_captions, references),
        "exact_match_tflite_float": heldout.exact_match(float_captions, references),
        "exact_match_tflite_int8": heldout.exact_match(int8_captions, references),
        "int8_float_agreement": float(np.mean([a == b for a, b in zip(int8_captions, float_captions)])),
        "train_seconds": round(trained_s),
        "total_seconds": round(time.perf_counter() - began),
    }
    provenance["heldout"] = figures
    export.write_bundle(out, args.name, config, vocab, models, SAMPLE_FPS, tokens, provenance)
    for key, value in figures.items():
        print(f"{key:28s} {value:.4f}" if isinstance(value, float) else f"{key:28s} {value}")
    for pred, refs in [(p, r) for p, r in zip(int8_captions, references) if p not in r][:10]:
        print(f"  miss: {pred!r} (expected {refs[0]!r})")
    return figures


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parses the recipe's command line (``python -m models.train --help``)."""
    parser = argparse.ArgumentParser(prog="python -m models.train", description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="dataset directory (clips/ + captions.json)")
    parser.add_argument("--out", required=True, help="bundle directory to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="edgecap-demo-shapes", help="bundle name")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--finetune-epochs", type=int, default=3,
                        help="RNN-only epochs on mixed int8/float features (0: none)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--bag-weight", type=float, default=0.5,
                        help="weight of the per-frame bag-of-words loss")
    parser.add_argument("--orientation-weight", type=float, default=1.0,
                        help="weight of the per-frame orientation loss, where the data annotate it")
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
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
