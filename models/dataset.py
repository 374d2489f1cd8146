"""A procedural video-captioning dataset: coloured shapes that move, grow, shrink or rotate.

Each clip shows one shape on a static textured background and is captioned from a
template, e.g. "a red star rotates clockwise". The first frame depends only on the
clip's start state, never on its motion, so the motion is visible only across
frames. Clips are written in the MSVD-like layout of ``edgecap.dataset``, which
reads real datasets too, with each outline's per-frame angle as an extra
annotation the training recipe uses:

    out_dir/clips/<id>.mp4
    out_dir/captions.json   {"clips": {id: [caption, ...]},
                             "splits": {"train": [id, ...], "val": [...], "test": [...]},
                             "fps": 16.0,
                             "orientation": {id: {"period_deg": P, "angles_deg": [...]}}}

It needs only numpy, OpenCV and ``edgecap.dataset``, so the default tests can import it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple, Union

import cv2
import numpy as np

from edgecap.dataset import Dataset

SHAPES: Tuple[str, ...] = ("circle", "square", "triangle", "star")
# BGR, as OpenCV draws.
COLORS: Dict[str, Tuple[int, int, int]] = {
    "red": (40, 40, 225),
    "green": (50, 205, 50),
    "blue": (230, 90, 30),
    "yellow": (30, 225, 235),
    "white": (245, 245, 245),
    "purple": (210, 50, 170),
}
MOTIONS: Tuple[str, ...] = (
    "moves left",
    "moves right",
    "moves up",
    "moves down",
    "grows",
    "shrinks",
    "rotates clockwise",
    "rotates counterclockwise",
)
ROTATIONS = ("rotates clockwise", "rotates counterclockwise")
BACKGROUNDS: Tuple[str, ...] = ("gradient", "texture", "stripes", "noise")

# Rotational symmetry period of each outline, degrees. A rotation is only readable
# between two sampled frames if it turns by less than half this period.
SYMMETRY_DEG = {"square": 90.0, "triangle": 120.0, "star": 72.0}

FRAMES = 16
FPS = 16.0
SIZE = 128
# Turn per frame as a fraction of the outline's symmetry period. Every other frame
# is sampled at the bundle's 8 fps, so a sample turns by 0.24-0.3 of the period:
# large enough to see at 64x64, and clear of the half period where clockwise and
# counterclockwise look alike.
TURN_PERIOD_PER_FRAME = (0.12, 0.15)
SHIFT_PX_PER_FRAME = (1.6, 2.4)  # at SIZE; scaled for other sizes
GROW_TOTAL = (1.5, 1.8)
SHRINK_TOTAL = (0.55, 0.65)


@dataclass(frozen=True)
class ClipSpec:
    """Everything that decides a clip's content; positions are fractions of the frame side.

    The start state (``x0``, ``y0``, ``radius0``, ``angle0``) is drawn independently of
    ``motion`` so that a single frame carries no hint of it.
    """

    shape: str
    color: str
    motion: str
    x0: float
    y0: float
    radius0: float
    angle0: float
    rate: float  # fraction of the motion's range, in [0, 1]
    background: str
    frames: int = FRAMES
    size: int = SIZE

    @property
    def caption(self) -> str:
        """The clip's templated caption."""
        return f"a {self.color} {self.shape} {self.motion}"


def random_spec(rng: np.random.Generator, frames: int = FRAMES, size: int = SIZE) -> ClipSpec:
    """Draws a clip spec; rotations are only drawn for shapes whose turn is visible.

    Args:
      rng: Source of randomness.
      frames: Frames in the clip.
      size: Side of the square frame, pixels.

    Returns:
      A ``ClipSpec``.
    """
    shape = SHAPES[rng.integers(len(SHAPES))]
    color = list(COLORS)[rng.integers(len(COLORS))]
    motions = [m for m in MOTIONS if shape != "circle" or m not in ROTATIONS]
    motion = motions[rng.integers(len(motions))]
    return ClipSpec(
        shape=shape,
        color=color,
        motion=motion,
        x0=float(rng.uniform(0.32, 0.68)),
        y0=float(rng.uniform(0.32, 0.68)),
        radius0=float(rng.uniform(0.15, 0.21)),
        angle0=float(rng.uniform(0.0, 360.0)),
        rate=float(rng.uniform(0.0, 1.0)),
        background=BACKGROUNDS[rng.integers(len(BACKGROUNDS))],
        frames=frames,
        size=size,
    )


def _lerp(bounds: Tuple[float, float], t: float) -> float:
    return bounds[0] + (bounds[1] - bounds[0]) * t


def _trajectory(spec: ClipSpec) -> np.ndarray:
    """Per-frame (x px, y px, radius px, angle deg), shape [frames, 4]."""
    s = spec.size
    t = np.arange(spec.frames, dtype=np.float64)
    last = max(spec.frames - 1, 1)
    x = np.full_like(t, spec.x0 * s)
    y = np.full_like(t, spec.y0 * s)
    r = np.full_like(t, spec.radius0 * s)
    a = np.full_like(t, spec.angle0)
    shift = _lerp(SHIFT_PX_PER_FRAME, spec.rate) * s / SIZE * t
    turn = _lerp(TURN_PERIOD_PER_FRAME, spec.rate) * SYMMETRY_DEG.get(spec.shape, 0.0) * t
    if spec.motion == "moves left":
        x = x - shift
    elif spec.motion == "moves right":
        x = x + shift
    elif spec.motion == "moves up":
        y = y - shift
    elif spec.motion == "moves down":
        y = y + shift
    elif spec.motion == "grows":
        r = r * _lerp(GROW_TOTAL, spec.rate) ** (t / last)
    elif spec.motion == "shrinks":
        r = r * _lerp(SHRINK_TOTAL, spec.rate) ** (t / last)
    elif spec.motion == "rotates clockwise":  # y points down, so +angle turns clockwise on screen
        a = a + turn
    elif spec.motion == "rotates counterclockwise":
        a = a - turn
    else:
        raise ValueError(f"unknown motion {spec.motion!r}")
    return np.stack([x, y, r, a], axis=1)


def _outline(shape: str, x: float, y: float, r: float, angle: float) -> np.ndarray:
    if shape == "square":
        radii, offsets = [r] * 4, [45.0 + 90.0 * k for k in range(4)]
    elif shape == "triangle":
        radii, offsets = [r] * 3, [-90.0 + 120.0 * k for k in range(3)]
    elif shape == "star":
        radii = [r if k % 2 == 0 else 0.45 * r for k in range(10)]
        offsets = [-90.0 + 36.0 * k for k in range(10)]
    else:
        raise ValueError(f"unknown polygon {shape!r}")
    rad = np.deg2rad(np.asarray(offsets) + angle)
    return np.stack([x + np.asarray(radii) * np.cos(rad), y + np.asarray(radii) * np.sin(rad)], 1)


_SUBPIXEL_BITS = 4


def _draw_shape(img: np.ndarray, shape: str, color: Tuple[int, int, int], state: np.ndarray) -> None:
    x, y, r, a = (float(v) for v in state)
    scale = 1 << _SUBPIXEL_BITS
    if shape == "circle":
        cv2.circle(img, (round(x * scale), round(y * scale)), round(r * scale), color, -1,
                   cv2.LINE_AA, _SUBPIXEL_BITS)
        return
    pts = np.round(_outline(shape, x, y, r, a) * scale).astype(np.int32)
    cv2.fillPoly(img, [pts], color, cv2.LINE_AA, _SUBPIXEL_BITS)


def _background(kind: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """A muted background, so every shape colour stays distinguishable on it."""
    base = rng.uniform(35, 140) + rng.uniform(-20, 20, size=3)
    tint = rng.uniform(-30, 30, size=(2, 3))
    if kind == "gradient":
        theta = rng.uniform(0, 2 * math.pi)
        yy, xx = np.mgrid[0:size, 0:size] / max(size - 1, 1)
        ramp = (np.cos(theta) * xx + np.sin(theta) * yy)
        ramp = (ramp - ramp.min()) / max(np.ptp(ramp), 1e-6)
        img = base + tint[0] + ramp[..., None] * (tint[1] - tint[0])
    elif kind == "texture":
        cells = int(rng.integers(3, 9))
        blotches = rng.uniform(-35, 35, size=(cells, cells, 3)).astype(np.float32)
        img = base + cv2.resize(blotches, (size, size), interpolation=cv2.INTER_CUBIC)
    elif kind == "stripes":
        theta = rng.uniform(0, math.pi)
        period = rng.uniform(0.08, 0.3) * size
        yy, xx = np.mgrid[0:size, 0:size]
        wave = np.sin(2 * math.pi * (np.cos(theta) * xx + np.sin(theta) * yy) / period)
        img = base + wave[..., None] * tint[0] * 0.8
    elif kind == "noise":
        img = base + rng.normal(0, 18, size=(size, size, 3))
    else:
        raise ValueError(f"unknown background {kind!r}")
    return np.clip(img, 0, 255).astype(np.float32)


def render_clip(
    spec: ClipSpec, rng: Union[np.random.Generator, int]
) -> Tuple[np.ndarray, str]:
    """Renders a clip: a shape following ``spec`` over a background with per-frame sensor noise.

    Args:
      spec: What to draw.
      rng: Generator or seed for the background, colour jitter and noise.

    Returns:
      ``(frames, caption)``: uint8 BGR frames ``[T, H, W, 3]`` and the clip's caption.
    """
    rng = np.random.default_rng(rng)
    background = _background(spec.background, spec.size, rng)
    color = tuple(
        int(np.clip(c + j, 0, 255)) for c, j in zip(COLORS[spec.color], rng.integers(-20, 21, 3))
    )
    frames = np.empty((spec.frames, spec.size, spec.size, 3), np.uint8)
    for i, state in enumerate(_trajectory(spec)):
        img = background.copy()
        _draw_shape(img, spec.shape, color, state)
        img += rng.normal(0, 4, size=img.shape).astype(np.float32)
        frames[i] = np.clip(img, 0, 255).astype(np.uint8)
    return frames, spec.caption


def write_video(path: Union[str, os.PathLike], frames: np.ndarray, fps: float) -> None:
    """Writes uint8 BGR frames ``[T, H, W, 3]`` to an MPEG-4 Part 2 (mp4v) file.

    Raises:
      OSError: If OpenCV cannot open a writer for ``path``.
    """
    height, width = frames.shape[1:3]
    writer = cv2.VideoWriter(os.fspath(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
    if not writer.isOpened():
        raise OSError(f"OpenCV cannot write {path}")
    try:
        for frame in frames:
            writer.write(frame)
    finally:
        writer.release()


def read_video(path: Union[str, os.PathLike]) -> Tuple[np.ndarray, float]:
    """Reads a video file into uint8 BGR frames ``[T, H, W, 3]``.

    Returns:
      ``(frames, fps)``.

    Raises:
      OSError: If the file cannot be opened or holds no frames.
    """
    cap = cv2.VideoCapture(os.fspath(path))
    try:
        fps = float(cap.get(cv2.CAP_PROP_FPS))
        frames = []
        ok, frame = cap.read()
        while ok:
            frames.append(frame)
            ok, frame = cap.read()
    finally:
        cap.release()
    if not frames:
        raise OSError(f"no frames could be read from {path}")
    return np.stack(frames), fps


def write_dataset(
    out_dir: Union[str, os.PathLike],
    n_clips: int,
    seed: int,
    frames: int = FRAMES,
    size: int = SIZE,
    fps: float = FPS,
    split_fractions: Sequence[float] = (0.8, 0.1, 0.1),
) -> Dataset:
    """Renders ``n_clips`` clips and writes them with their captions and splits.

    Clip i is rendered from ``numpy.random.default_rng([seed, i])``, so a dataset is
    a pure function of its arguments.

    Args:
      out_dir: Directory to create or fill.
      n_clips: Number of clips.
      seed: Dataset seed.
      frames: Frames per clip.
      size: Frame side, pixels.
      fps: Frame rate recorded in the files.
      split_fractions: Train, val and test fractions, in that order.

    Returns:
      The written ``Dataset``.
    """
    root = Path(out_dir)
    (root / "clips").mkdir(parents=True, exist_ok=True)
    captions: Dict[str, List[str]] = {}
    orientation: Dict[str, dict] = {}
    for i in range(n_clips):
        rng = np.random.default_rng([seed, i])
        clip_id = f"clip{i:05d}"
        spec = random_spec(rng, frames, size)
        video, caption = render_clip(spec, rng)
        write_video(root / "clips" / f"{clip_id}.mp4", video, fps)
        captions[clip_id] = [caption]
        if spec.shape in SYMMETRY_DEG:
            orientation[clip_id] = {
                "period_deg": SYMMETRY_DEG[spec.shape],
                "angles_deg": [round(float(a), 3) for a in _trajectory(spec)[:, 3]]}
    ids = list(captions)
    n_train = round(split_fractions[0] * n_clips)
    n_val = round(split_fractions[1] * n_clips)
    splits = {
        "train": ids[:n_train],
        "val": ids[n_train:n_train + n_val],
        "test": ids[n_train + n_val:],
    }
    meta = {"clips": captions, "splits": splits, "fps": fps, "orientation": orientation}
    (root / "captions.json").write_text(json.dumps(meta, indent=1) + "\n")
    return Dataset(root, captions, splits, fps, orientation)


def sample_window(
    frames: np.ndarray, fps: float, sample_fps: float, n: int, start: int = 0
) -> np.ndarray:
    """Picks ``n`` frames at ``sample_fps`` from a clip at ``fps``, from frame ``start`` on.

    Frames past the end repeat the last one, so short clips still fill a window.

    Returns:
      The sampled frames ``[n, H, W, C]``.
    """
    return frames[sample_indices(len(frames), fps, sample_fps, n, start)]


def sample_indices(
    length: int, fps: float, sample_fps: float, n: int, start: int = 0
) -> np.ndarray:
    """Returns the frame indices ``sample_window`` picks from a clip of ``length`` frames."""
    step = fps / sample_fps if sample_fps > 0 else 1.0
    return np.minimum(start + np.round(np.arange(n) * step).astype(int), length - 1)


def _main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m models.dataset", description="Render the synthetic shapes dataset."
    )
    parser.add_argument("out_dir", help="directory to write clips/ and captions.json into")
    parser.add_argument("--clips", type=int, default=4000, help="number of clips")
    parser.add_argument("--seed", type=int, default=0, help="dataset seed")
    parser.add_argument("--frames", type=int, default=FRAMES, help="frames per clip")
    parser.add_argument("--size", type=int, default=SIZE, help="frame side in pixels")
    parser.add_argument("--fps", type=float, default=FPS, help="frame rate of the files")
    parser.add_argument("--splits", default="0.8,0.1,0.1",
                        help="train,val,test fractions (0,0,1 for an evaluation set)")
    args = parser.parse_args(argv)
    fractions = [float(f) for f in args.splits.split(",")]
    if len(fractions) != 3:
        parser.error("--splits takes three comma-separated fractions")
    began = time.perf_counter()
    dataset = write_dataset(
        args.out_dir, args.clips, args.seed, args.frames, args.size, args.fps, fractions
    )
    counts = ", ".join(f"{k} {len(v)}" for k, v in dataset.splits.items())
    print(f"wrote {len(dataset.captions)} clips ({counts}) to {dataset.root} "
          f"in {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
