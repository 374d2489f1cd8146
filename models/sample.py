"""The demo sample: a few synthetic clips back to back, with each window's ground truth.

    python -m models.sample models/demo --events 3 --seed 2033

writes ``sample.mp4`` and ``sample.json``::

    {"video": "sample.mp4", "fps": 16.0, "frames": 48,
     "windows": [{"start_frame": 0, "end_frame": 15, "caption": "a red star grows"}, ...]}

Each event is one clip of ``models.dataset`` (16 frames at 16 fps), so at the
demo bundle's 8 fps sampling and 8-frame windows, window i covers event i.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np

from models.dataset import FPS, random_spec, render_clip, write_video


def write_sample(out_dir: Path, events: int, seed: int) -> Dict[str, object]:
    """Renders ``events`` clips with distinct motions and writes them as one video.

    Args:
      out_dir: Directory for ``sample.mp4`` and ``sample.json``.
      events: Number of clips.
      seed: Seed; use one the training data did not use.

    Returns:
      The contents written to ``sample.json``.
    """
    rng = np.random.default_rng(seed)
    clips: List[np.ndarray] = []
    windows: List[Dict[str, object]] = []
    motions = set()
    while len(clips) < events:
        spec = random_spec(rng)
        if spec.motion in motions:
            continue
        motions.add(spec.motion)
        frames, caption = render_clip(spec, rng)
        start = sum(len(c) for c in clips)
        windows.append({"start_frame": start, "end_frame": start + len(frames) - 1, "caption": caption})
        clips.append(frames)
    out_dir.mkdir(parents=True, exist_ok=True)
    video = np.concatenate(clips)
    write_video(out_dir / "sample.mp4", video, FPS)
    meta = {"video": "sample.mp4", "fps": FPS, "frames": len(video), "seed": seed, "windows": windows}
    (out_dir / "sample.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.sample", description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--events", type=int, default=3)
    parser.add_argument("--seed", type=int, default=2033)
    args = parser.parse_args(argv)
    meta = write_sample(args.out_dir, args.events, args.seed)
    for w in meta["windows"]:
        print(f"frames {w['start_frame']:3d}-{w['end_frame']:3d}: {w['caption']}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
