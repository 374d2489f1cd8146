"""Any Keras image backbone with a pooled output as a bundle encoder, with an S2VT RNN behind it.

This is the path from a user's own trained Keras CNN to a bundle
(docs/bundle.md): the backbone is wrapped to take one frame and give one
feature vector, exported full-int8 like the demo's encoder, and joined to
the S2VT step models (``models.architectures.build_rnn``), either the user's
trained RNN or a fresh random one. ``models.paper_bundles`` builds the
paper-scale bundles (ResNet50, InceptionV3, MobileNetV2) with it.

Needs TensorFlow (``pip install -e .[train]``).

Example::

    python -m models.backbones --keras my_backbone.keras --out my_bundle \\
        --rnn my_rnn.keras --vocab my_vocab.txt --weights trained
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import cv2
import keras
import numpy as np

from edgecap.errors import ConfigError, EdgecapError
from edgecap.outputs import check_output
from models.architectures import ModelConfig, build_rnn
from models.bundle_meta import WEIGHTS, InputNorm, weights_note
from models.dataset import read_video
from models.export import float_encoder, int8_encoder, step_models, write_bundle

DEMO = Path(__file__).resolve().parent / "demo"
# The demo's vocabulary and special tokens: the recipe's decoders emit the demo's words.
DEMO_TOKENS = {"pad": 0, "bos": 1, "eos": 2, "unk": 3}


@dataclass(frozen=True)
class EncoderSource:
    """A frame CNN ready for export and what its input wants.

    Attributes:
      model: Keras model, one ``[1,S,S,3]`` float frame in, one ``[1,F]`` feature out.
      input_size: S.
      norm: Channel order and normalisation of the frames it was trained on.
    """

    model: keras.Model
    input_size: int
    norm: InputNorm

    @property
    def feature_size(self) -> int:
        """F, the pooled feature size."""
        return int(self.model.outputs[0].shape[-1])


def pooled_encoder(backbone: keras.Model, norm: InputNorm) -> EncoderSource:
    """Wraps a Keras image backbone so that it takes one frame and gives one feature vector.

    Args:
      backbone: A built model with one square image input ``[B,S,S,3]`` and an output
        that is either pooled ``[B,F]`` or a feature map ``[B,h,w,F]`` (averaged here).
      norm: How frames are normalised before the backbone's first layer.

    Returns:
      The encoder source.

    Raises:
      ValueError: If the input is not a fixed square RGB frame or the output is neither
        a vector nor a feature map.
    """
    if len(backbone.inputs) != 1 or len(backbone.outputs) != 1:
        raise ValueError(f"{backbone.name}: a backbone has one input and one output, has "
                         f"{len(backbone.inputs)} and {len(backbone.outputs)}")
    shape = tuple(backbone.inputs[0].shape[1:])
    if len(shape) != 3 or shape[0] is None or shape[0] != shape[1] or shape[2] != 3:
        raise ValueError(f"{backbone.name}: input {shape} is not a fixed square RGB frame: "
                         "build it with input_shape=(S, S, 3)")
    rank = len(backbone.outputs[0].shape)
    if rank == 4:
        frame = keras.Input(shape, name="frame")
        feature = keras.layers.GlobalAveragePooling2D(name="pool")(backbone(frame))
        backbone = keras.Model(frame, feature, name=f"{backbone.name}_pooled")
    elif rank != 2:
        raise ValueError(f"{backbone.name}: output has rank {rank}: give a pooled [B,F] output "
                         "or a [B,h,w,F] feature map")
    return EncoderSource(backbone, int(shape[0]), norm)


def calibration_frames(source: EncoderSource, count: int, clip: Path = DEMO / "sample.mp4") -> np.ndarray:
    """Returns frames of a clip, preprocessed as the runtime does, for int8 calibration.

    Resized with ``INTER_AREA`` and normalised ``(pixel - mean) / std`` in the
    encoder's channel order, as ``edgecap.preprocess`` feeds the encoder.

    Args:
      source: The encoder the frames are for.
      count: Frames, spread evenly over the clip.
      clip: A video file.

    Returns:
      Float32 ``[count,S,S,3]``.
    """
    video, _ = read_video(clip)
    picks = np.linspace(0, len(video) - 1, count).round().astype(int)
    s, norm = source.input_size, source.norm
    out = []
    for bgr in video[picks]:
        frame = bgr if norm.color_order == "BGR" else cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        frame = cv2.resize(frame, (s, s), interpolation=cv2.INTER_AREA).astype(np.float32)
        out.append((frame - np.float32(norm.mean)) / np.float32(norm.std))
    return np.stack(out)


def _layers(model: keras.Model) -> Iterator[keras.layers.Layer]:
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _layers(layer)


def fit_batchnorm(source: EncoderSource, frames: np.ndarray) -> int:
    """Sets every BatchNormalization layer's moving statistics to the statistics of ``frames``.

    For random weights only (a trained backbone keeps its own): at
    initialisation the moving statistics are (0, 1), so activations shrink or
    grow layer after layer and the pooled feature ends up the same for every
    frame (MobileNetV2's spans 1e-8), which makes int8 features, and every
    caption, one constant. One training-mode pass with zero momentum sets each
    layer's statistics from the layers before it, so inference sees unit-scale
    activations that vary with the frame.

    Args:
      source: The encoder, changed in place.
      frames: Normalised frames ``[K,S,S,3]``, K > 1.

    Returns:
      How many layers were set.
    """
    norms = [layer for layer in _layers(source.model)
             if isinstance(layer, keras.layers.BatchNormalization)]
    saved = [layer.momentum for layer in norms]
    try:
        for layer in norms:
            layer.momentum = 0.0
        source.model(frames, training=True)
    finally:
        for layer, momentum in zip(norms, saved):
            layer.momentum = momentum
    return len(norms)


def distinct_int8_features(encoder: Path, frames: np.ndarray) -> int:
    """Returns how many different int8 feature vectors an int8 encoder gives for ``frames``.

    A random backbone whose features are one constant (see ``fit_batchnorm``)
    gives 1: every caption would be the same and exactness checks would pass
    trivially.
    """
    from edgecap.interpreter import make_cpu_interpreter

    interp = make_cpu_interpreter(encoder)
    (inp,), (out,) = interp.get_input_details(), interp.get_output_details()
    scale, zero = inp["quantization"]
    seen = set()
    for frame in frames:
        q = np.clip(np.round(frame / scale) + zero, -128, 127).astype(inp["dtype"])
        interp.set_tensor(inp["index"], q[None])
        interp.invoke()
        seen.add(interp.get_tensor(out["index"]).tobytes())
    return len(seen)


def random_rnn(feature_size: int, hidden_size: int, vocab_size: int, seed: int = 0) -> keras.Model:
    """Builds the demo's S2VT RNN (``build_rnn``) at a new size with random weights."""
    keras.utils.set_random_seed(seed)
    config = replace(ModelConfig(), feature_size=feature_size, hidden_size=hidden_size,
                     embed_size=hidden_size)
    return build_rnn(config, vocab_size)


def _rnn_config(rnn: keras.Model, source: EncoderSource, vocab_size: int, window_frames: int,
                max_caption_length: int) -> ModelConfig:
    names = {layer.name for layer in rnn.layers}
    missing = sorted({"enc_lstm", "embed", "dec_lstm", "logits"} - names)
    if missing:
        raise ValueError(f"{rnn.name}: no layer {', '.join(missing)}: build the RNN with "
                         "models.architectures.build_rnn")
    enc = rnn.get_layer("enc_lstm")
    feature = int(enc.input.shape[-1])
    if feature != source.feature_size:
        raise ValueError(f"the RNN takes {feature} features but the encoder gives "
                         f"{source.feature_size}: train the RNN on this backbone's features")
    logits = int(rnn.get_layer("logits").units)
    if logits != vocab_size:
        raise ValueError(f"the RNN emits {logits} logits but the vocabulary has {vocab_size} "
                         "tokens: use the vocabulary the RNN was trained with")
    return ModelConfig(input_size=source.input_size, feature_size=feature,
                       hidden_size=int(enc.units), window_frames=window_frames,
                       max_caption_length=max_caption_length)


def build_bundle(
    out_dir: Path,
    name: str,
    source: EncoderSource,
    rnn: keras.Model,
    vocab: Sequence[str],
    weights: str,
    calibration: np.ndarray,
    provenance: Dict[str, object],
    tokens: Optional[Dict[str, int]] = None,
    window_frames: int = 8,
    sample_fps: float = 8.0,
    max_caption_length: int = 8,
    reference: bool = False,
) -> Path:
    """Exports an encoder source and an RNN into a bundle directory.

    Args:
      out_dir: Bundle directory, created if missing.
      name: Bundle name.
      source: The frame encoder.
      rnn: A model from ``build_rnn`` (layers ``enc_lstm``, ``embed``, ``dec_lstm``, ``logits``).
      vocab: Tokens in id order; as many as the RNN's logits.
      weights: One of ``WEIGHTS``: whether captions mean anything.
      calibration: Normalised frames ``[K,S,S,3]`` the int8 ranges are measured on.
      provenance: Recipe facts recorded in ``bundle.json``.
      tokens: Special token ids (default: the demo's).
      window_frames: Sampled frames per caption window.
      sample_fps: Rate frames are sampled at.
      max_caption_length: Most words a caption has.
      reference: Whether to write the float ``reference_encoder`` too (as large as the
        float model; only ``edgecap eval`` reads it).

    Returns:
      The path of ``bundle.json``.

    Raises:
      ValueError: If ``weights`` is unknown, or the RNN does not fit the encoder or the vocabulary.
    """
    meta_extra = {"weights": weights, "weights_note": weights_note(weights)}
    config = _rnn_config(rnn, source, len(vocab), window_frames, max_caption_length)
    size = source.input_size
    models = {"encoder": int8_encoder(source.model, size, calibration)}
    if reference:
        models["reference_encoder"] = float_encoder(source.model, size)
    models.update(step_models(rnn, config))
    return write_bundle(out_dir, name, config, vocab, models, sample_fps,
                        tokens or dict(DEMO_TOKENS), provenance, norm=source.norm,
                        extra=meta_extra)


@contextlib.contextmanager
def staged_dir(final: Path) -> Iterator[Path]:
    """Yields a new folder beside ``final`` and puts it in ``final``'s place if the block succeeds.

    A bundle is built in the folder and moved in whole, so a reader never sees
    half of one: if the block raises, the folder is removed and ``final`` (an
    earlier bundle, or nothing) is left as it was.

    Args:
      final: Where the folder goes; its parent must exist.

    Yields:
      The temporary folder.
    """
    final = Path(os.path.abspath(final))  # "." or "out/" has a name and a parent too
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        yield tmp
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the bundle from other users
        if final.exists():
            # Set aside, not deleted first: a failed rename leaves the old bundle in reach.
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}-old-", dir=final.parent))
            final.rename(old / final.name)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def demo_vocab() -> List[str]:
    """Returns the shipped demo bundle's vocabulary, id order."""
    return (DEMO / "bundle" / "vocab.txt").read_text(encoding="utf-8").splitlines()


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m models.backbones",
                                description="Turn a Keras image backbone (+ an S2VT RNN) into a bundle.")
    p.add_argument("--keras", type=Path, required=True,
                   help="saved Keras backbone (.keras): one square RGB input, pooled or map output")
    p.add_argument("--out", type=Path, required=True,
                   help="bundle directory to write (a bundle already there is replaced whole)")
    p.add_argument("--rnn", type=Path, help="saved Keras RNN from models.architectures.build_rnn "
                   "(default: a random one; captions are then meaningless)")
    p.add_argument("--vocab", type=Path, help="vocabulary, one token a line (default: the demo's)")
    p.add_argument("--hidden", type=int, default=512, help="hidden size of a random RNN")
    p.add_argument("--weights", choices=WEIGHTS, default="trained",
                   help="what the weights are (forced to random without --rnn)")
    p.add_argument("--mean", type=float, nargs=3, default=(127.5,) * 3)
    p.add_argument("--std", type=float, nargs=3, default=(127.5,) * 3)
    p.add_argument("--color-order", choices=("RGB", "BGR"), default="RGB")
    p.add_argument("--calibration", type=Path, default=DEMO / "sample.mp4",
                   help="video whose frames calibrate the int8 ranges (use your own footage)")
    p.add_argument("--calibration-frames", type=int, default=16)
    p.add_argument("--name", help="bundle name (default: the output directory's name)")
    return p.parse_args(argv)


def _check(args: argparse.Namespace) -> Optional[str]:
    """Returns what is wrong with the arguments, before any model is loaded, or None."""
    for flag, path in (("--keras", args.keras), ("--rnn", args.rnn), ("--vocab", args.vocab),
                       ("--calibration", args.calibration)):
        if path is not None and not path.is_file():
            return f"{path}: no such file ({flag}): give an existing file"
    if any(s <= 0 for s in args.std):
        return f"--std {' '.join(map(str, args.std))}: every std must be > 0"
    if args.calibration_frames < 1 or args.hidden < 1:
        return "--calibration-frames and --hidden must be at least 1"
    try:
        check_output(args.out, "--out", directory=True)
    except ConfigError as e:
        return str(e)
    # The bundle replaces --out whole: never a folder that holds something else.
    if args.out.is_dir() and any(args.out.iterdir()) and not (args.out / "bundle.json").is_file():
        return (f"--out {args.out}: a folder that is not a bundle and is not empty: "
                "choose a new folder (a bundle there is replaced whole)")
    return None


def _main(argv: Sequence[str]) -> int:
    args = _parse(argv)
    problem = _check(args)
    if problem is not None:
        print(f"python -m models.backbones: error: {problem}", file=sys.stderr)
        return 2
    start = time.monotonic()
    norm = InputNorm(args.color_order, tuple(args.mean), tuple(args.std))
    vocab = (args.vocab.read_text(encoding="utf-8").splitlines() if args.vocab else demo_vocab())
    try:
        source = pooled_encoder(keras.models.load_model(args.keras, compile=False), norm)
        if args.rnn:
            rnn, weights = keras.models.load_model(args.rnn, compile=False), args.weights
        else:
            rnn, weights = random_rnn(source.feature_size, args.hidden, len(vocab)), "random"
        _rnn_config(rnn, source, len(vocab), 1, 1)  # refuses a misfit before the slow export
        frames = calibration_frames(source, args.calibration_frames, args.calibration)
    except (ValueError, OSError) as e:
        print(f"python -m models.backbones: error: {e}", file=sys.stderr)
        return 2
    try:
        with staged_dir(args.out) as tmp:
            build_bundle(tmp, args.name or args.out.name, source, rnn, vocab, weights, frames,
                         {"recipe": "python -m models.backbones " + " ".join(argv),
                          "calibration": f"{len(frames)} frames of {args.calibration.name}"})
    except (ValueError, OSError, EdgecapError) as e:  # e.g. the disk filled: nothing was written
        print(f"python -m models.backbones: error: {e}", file=sys.stderr)
        return 2
    print(f"{args.out / 'bundle.json'} ({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
