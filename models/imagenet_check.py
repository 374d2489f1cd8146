"""Whether an ImageNet backbone sees what is in real photos: top-5 classes, and nearest photo for embeddings.

    python -m models.imagenet_check --photos PHOTO ... \\
        --classifier NAME MODEL.tflite MEAN STD [--classifier ...] \\
        [--extractor NAME MODEL.tflite MEAN STD ...] [--json OUT.json]

Each photo is centre-cropped to a square and fed through the runtime's own
preprocessing (``edgecap.preprocess.Preprocessor``: ``INTER_AREA`` resize,
RGB, ``(pixel - MEAN) / STD``, the input's quantisation), as a frame of a
video would be. A classifier's output (1000 classes, or 1001 with Coral's
"background" first) gives the top-5 labels and their probability (a softmax
of the logits, or the output itself where the model ends in a softmax).
An embedding extractor has no classifier layer, so it is checked by
retrieval instead: each photo is seen twice (the centre crop and the whole
photo squeezed and mirrored), and the nearest other view by cosine
similarity should be the same photo's.

Prints a Markdown table; ``--json`` keeps the figures. Needs numpy, OpenCV
and ``edgecap`` only (no TensorFlow).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import cv2
import numpy as np

from models.bundle_meta import InputNorm
from models.feature_cache import TfliteFrameEncoder

LABELS = Path(__file__).resolve().parent / "data" / "imagenet_labels.txt"


@dataclass(frozen=True)
class Guess:
    """One of a photo's top classes."""

    label: str
    probability: float


def centre_square(bgr: np.ndarray) -> np.ndarray:
    """Returns the largest centred square of an image."""
    h, w = bgr.shape[:2]
    side = min(h, w)
    y, x = (h - side) // 2, (w - side) // 2
    return bgr[y:y + side, x:x + side]


def read_photo(path: Path) -> np.ndarray:
    """Reads a photo as BGR uint8.

    Raises:
      ValueError: If OpenCV cannot read it.
    """
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError(f"{path}: not an image OpenCV reads: give a PNG or JPEG photo")
    return image


def top_k(logits: np.ndarray, labels: Sequence[str], k: int = 5) -> List[Guess]:
    """Returns the ``k`` most probable classes of one output vector.

    Args:
      logits: Scores, ``[1000]`` (ImageNet) or ``[1001]`` (Coral's, "background" first).
      labels: Coral's ``imagenet_labels.txt`` lines: "background" then the 1000 classes.
      k: How many.

    Raises:
      ValueError: If the output has neither 1000 nor 1001 classes.
    """
    scores = np.asarray(logits, np.float64).reshape(-1)
    if len(scores) == len(labels) - 1:
        labels = labels[1:]  # a 1000-class model has no background
    elif len(scores) != len(labels):
        raise ValueError(f"{len(scores)} outputs but {len(labels)} labels: not an ImageNet classifier")
    if scores.min() >= 0 and 0.5 <= scores.sum() <= 1.05:
        # Already a softmax (Coral's classifiers end in one). Its uint8 output rounds
        # small probabilities to 0, so it may sum well under 1: taken as it is.
        p = scores
    else:
        p = np.exp(scores - scores.max())
        p /= p.sum()
    best = np.argsort(-p, kind="stable")[:k]
    return [Guess(labels[i].split(",")[0], round(float(p[i]), 3)) for i in best]


def nearest_views(features: Dict[str, Tuple[np.ndarray, np.ndarray]]) -> Dict[str, Tuple[str, float]]:
    """For each photo's first view, the photo whose second view is nearest by cosine similarity.

    Args:
      features: Photo name -> (feature of view 1, feature of view 2).

    Returns:
      Photo name -> (nearest photo's name, similarity).
    """
    names = list(features)

    def unit(v: np.ndarray) -> np.ndarray:
        return v / max(float(np.linalg.norm(v)), 1e-12)

    a = np.stack([unit(features[n][0]) for n in names])
    b = np.stack([unit(features[n][1]) for n in names])
    sim = a @ b.T
    return {n: (names[int(sim[i].argmax())], round(float(sim[i].max()), 3)) for i, n in enumerate(names)}


def _views(bgr: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    h, w = bgr.shape[:2]
    side = min(h, w)
    squeezed = cv2.resize(bgr, (side, side), interpolation=cv2.INTER_AREA)
    return centre_square(bgr), np.ascontiguousarray(squeezed[:, ::-1])


def _norm(mean: float, std: float) -> InputNorm:
    return InputNorm("RGB", (mean,) * 3, (std,) * 3)


def check(photos: Sequence[Path], classifiers: Sequence[Tuple[str, Path, float, float]],
          extractors: Sequence[Tuple[str, Path, float, float]], labels: Sequence[str]) -> Dict:
    """Runs every model on every photo; returns ``{"top5": {model: {photo: [Guess]}}, "nearest": ...}``."""
    images = {p.stem: read_photo(p) for p in photos}
    out: Dict[str, Dict] = {"top5": {}, "nearest": {}}
    for name, model, mean, std in classifiers:
        encoder = TfliteFrameEncoder(model, _norm(mean, std))
        out["top5"][name] = {photo: [asdict(g) for g in top_k(encoder(centre_square(img)), labels)]
                             for photo, img in images.items()}
    for name, model, mean, std in extractors:
        encoder = TfliteFrameEncoder(model, _norm(mean, std))
        feats = {photo: tuple(encoder(v) for v in _views(img)) for photo, img in images.items()}
        out["nearest"][name] = {photo: list(hit) for photo, hit in nearest_views(feats).items()}
    return out


def table(result: Dict) -> str:
    """Returns the result as Markdown: one row per photo, one column per model."""
    photos = sorted({p for per in list(result["top5"].values()) + list(result["nearest"].values())
                     for p in per})
    models = list(result["top5"]) + list(result["nearest"])
    lines = ["| photo | " + " | ".join(models) + " |", "|---" * (len(models) + 1) + "|"]
    for photo in photos:
        cells = []
        for m in result["top5"]:
            cells.append(", ".join(f"{g['label']} {g['probability']:.2f}" for g in result["top5"][m][photo]))
        for m in result["nearest"]:
            hit, sim = result["nearest"][m][photo]
            cells.append(f"nearest view: {hit} ({sim:.2f})")
        lines.append(f"| {photo} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m models.imagenet_check", description=__doc__.split("\n")[0])
    p.add_argument("--photos", type=Path, nargs="+", required=True)
    p.add_argument("--classifier", nargs=4, action="append", default=[],
                   metavar=("NAME", "MODEL", "MEAN", "STD"), help="an ImageNet classifier .tflite")
    p.add_argument("--extractor", nargs=4, action="append", default=[],
                   metavar=("NAME", "MODEL", "MEAN", "STD"), help="an embedding extractor .tflite")
    p.add_argument("--labels", type=Path, default=LABELS,
                   help="Coral's imagenet_labels.txt (background, then 1000 classes)")
    p.add_argument("--json", type=Path, help="write the figures here too")
    return p.parse_args(argv)


def _models(specs: Sequence[Sequence[str]]) -> List[Tuple[str, Path, float, float]]:
    out = []
    for name, model, mean, std in specs:
        if not Path(model).is_file():
            raise ValueError(f"{model}: no such file ({name}): give the .tflite path")
        out.append((name, Path(model), float(mean), float(std)))
    return out


def main(argv: Sequence[str]) -> int:
    """Command-line entry point; bad input is one line and exit 2."""
    args = _parse(argv)
    try:
        result = check(args.photos, _models(args.classifier), _models(args.extractor),
                       args.labels.read_text(encoding="utf-8").splitlines())
    except (ValueError, OSError) as e:
        print(f"python -m models.imagenet_check: error: {e}", file=sys.stderr)
        return 2
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
