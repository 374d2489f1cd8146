"""Does the detector survive full-int8? Object precision and recall of the float graph and the int8 encoder.

    python -m models.int8_survival --nanodet PATH/nanodet.json --bundle models/coco_nanodet/bundle \\
        --images DIR --annotations instances.json --json docs/real-int8.json

On annotated COCO images (not the report set), a class is "found" in an image
when its best score reaches the threshold: for the float model, NanoDet's
original graph (TensorFlow, its ``-inf`` padding kept) and its sigmoid scores;
for the int8 model, the bundle's ``encoder.tflite`` through the runtime's own
preprocessing. Precision and recall against the annotated classes, at the
bundle's threshold and around it. Needs TensorFlow (the float graph).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Dict, Sequence

import cv2
import numpy as np

from models import coco_bundle, nanodet


def float_presence(detector: "nanodet.FloatDetector", images: Dict[int, Path]) -> Dict[int, np.ndarray]:
    """Each image's best float score per class ``[80]``."""
    return {i: np.max([s.max(axis=0) for s in detector.raw(cv2.imread(str(p)))[0]], axis=0)
            for i, p in images.items()}


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.int8_survival", description=__doc__.splitlines()[0])
    parser.add_argument("--nanodet", type=Path, required=True)
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--images", type=Path, required=True)
    parser.add_argument("--annotations", type=Path, required=True)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    meta = json.loads((args.bundle / "bundle.json").read_text())
    chosen = float(meta["provenance"]["threshold"])
    images, truth = coco_bundle.read_instances(args.annotations, args.images)
    scores = {"float": float_presence(nanodet.FloatDetector(args.nanodet), images),
              "int8": coco_bundle.presence_scores(coco_bundle.HeatEncoder(args.bundle / meta["encoder"]), images)}
    rows = []
    for t in sorted({round(chosen + d, 2) for d in (-0.1, -0.05, 0.0, 0.05, 0.1)}):
        row = {"threshold": t}
        for name, s in scores.items():
            p, r = coco_bundle.presence_pr(s, truth, t)
            row[name] = {"precision": round(p, 4), "recall": round(r, 4)}
        rows.append(row)
    diff = np.abs(np.stack([scores["float"][i] - scores["int8"][i] for i in images]))
    report = {"images": len(images), "annotations": str(args.annotations), "bundle_threshold": chosen,
              "rows": rows, "best_score_abs_diff": {"mean": round(float(diff.mean()), 5),
                                                    "max": round(float(diff.max()), 5)},
              "load_average": os.getloadavg()}
    print(f"{'threshold':>9}  {'float P':>8}{'float R':>8}  {'int8 P':>8}{'int8 R':>8}")
    for row in rows:
        print(f"{row['threshold']:>9.2f}  {row['float']['precision']:>8.3f}{row['float']['recall']:>8.3f}"
              f"  {row['int8']['precision']:>8.3f}{row['int8']['recall']:>8.3f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
