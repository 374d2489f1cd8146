"""Host fps of captioning a video file, A/B between two edgecap checkouts, interleaved.

    python tools/feeder_bench.py --make-clips /tmp/feeder-clips
    python tools/feeder_bench.py --clip /tmp/feeder-clips/demo-128.mp4 \
        --checkout before=/work/main --checkout after=. --rounds 5 --json results/feeder-bench.json

Each round runs every checkout once, in turn, on the same clip (so load from
elsewhere falls on all of them alike; the order reverses every round): a child
process with that checkout first on ``PYTHONPATH`` captions the clip from the
file as ``edgecap caption`` does (decode, sample, preprocess, CNN, RNN,
decode), once to warm up and once measured, and reports the pipeline's
steady-state fps (frames out per second, ``stats().fps_out``) and the
process's CPU time per frame out (all threads), which load from elsewhere
barely moves. ``--pipelined`` runs every stage on its own thread with a
one-thread CNN, as on a board; without it the runtime's host rule decides
(the demo's sub-millisecond CNN: sequential, one thread). The table gives
each checkout's median and range over the rounds. Figures are *measured* on
this host. ``--make-clips``
writes two long clips of the demo's shapes: at the demo's size (128x128) and
at a camera's (640x480 would not be square: 480x480).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

REPO = Path(__file__).resolve().parent.parent
# The child: caption one file, print its fps. Only the public API, so any checkout runs it.
_CHILD = """\
import json, sys, time
from edgecap.captioner import EdgeCaptioner
kwargs = json.loads(sys.argv[2])
with EdgeCaptioner(**kwargs) as cap:
    sum(1 for _ in cap.stream(sys.argv[1]))  # warm-up
    cpu = time.process_time()
    n = sum(1 for _ in cap.stream(sys.argv[1]))
    cpu = time.process_time() - cpu
    stats = cap.stats()
print(json.dumps({"fps": stats.fps_out, "cpu_ms_per_frame": cpu * 1e3 / max(stats.frames_out, 1),
                  "captions": n, "frames": stats.frames_out}))
"""


def make_clips(out: Path, clips: int = 60) -> List[Path]:
    """Writes ``demo-128.mp4`` and ``demo-480.mp4``: ``clips`` demo clips one after another."""
    sys.path.insert(0, str(REPO))
    from models.dataset import FPS, random_spec, render_clip, write_video

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for size in (128, 480):
        frames = []
        for i in range(clips):
            rng = np.random.default_rng([7, i])
            frames.append(render_clip(random_spec(rng, size=size), rng)[0])
        path = out / f"demo-{size}.mp4"
        write_video(path, np.concatenate(frames), FPS)
        paths.append(path)
    return paths


def run_once(checkout: Path, clip: Path, options: Dict[str, object]) -> Dict[str, float]:
    """Captions ``clip`` in a child process that imports edgecap from ``checkout``."""
    env = dict(os.environ, PYTHONPATH=str(checkout.resolve()))
    done = subprocess.run([sys.executable, "-c", _CHILD, str(clip), json.dumps(options)],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: the run failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python tools/feeder_bench.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--make-clips", type=Path, help="write the two long clips here and exit")
    parser.add_argument("--clip", type=Path, action="append", default=[], help="a video file (repeatable)")
    parser.add_argument("--checkout", action="append", default=[],
                        help="NAME=DIR of an edgecap checkout (repeatable; e.g. before=/work/main)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bundle", type=Path, default=REPO / "models" / "demo" / "bundle")
    parser.add_argument("--pipelined", action="store_true",
                        help="every stage on its own thread, a one-thread CNN (default: the host rule)")
    parser.add_argument("--json", type=Path)
    return parser


def run_rounds(clips: Sequence[Path], checkouts: Dict[str, str], rounds: int, options: Dict[str, object]
               ) -> Tuple[Dict[str, Dict[str, List[float]]], Dict[str, Dict[str, List[float]]]]:
    """Captions each clip with each checkout, ``rounds`` times, the checkouts' order reversed every other round.

    Returns:
      fps and CPU ms a frame, by clip and checkout, a value per round.
    """
    fps: Dict[str, Dict[str, List[float]]] = {str(c): {n: [] for n in checkouts} for c in clips}
    cpu: Dict[str, Dict[str, List[float]]] = {str(c): {n: [] for n in checkouts} for c in clips}
    order = list(checkouts.items())
    for round_ in range(rounds):
        for clip in clips:
            for name, checkout in order if round_ % 2 == 0 else order[::-1]:
                got = run_once(Path(checkout), clip, options)
                fps[str(clip)][name].append(round(got["fps"], 2))
                cpu[str(clip)][name].append(round(got["cpu_ms_per_frame"], 3))
    return fps, cpu


def main(argv: Sequence[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.make_clips is not None:
        for path in make_clips(args.make_clips):
            print(path)
        return 0
    checkouts = dict(c.split("=", 1) for c in args.checkout)
    if not args.clip or not checkouts:
        parser.error("give --clip and --checkout NAME=DIR (or --make-clips DIR)")
    options: Dict[str, object] = {"bundle": str(args.bundle.resolve())}
    if args.pipelined:
        options.update(pipelined=True, num_threads=1)
    fps, cpu = run_rounds(args.clip, checkouts, args.rounds, options)
    print(f"{'clip':<20}{'checkout':<10}{'median fps':>11}{'min':>8}{'max':>8}{'CPU ms/frame':>14}  "
          f"(measured, {args.rounds} rounds interleaved, {os.cpu_count()} CPUs, shared host)")
    for clip, by_name in fps.items():
        for name, values in by_name.items():
            print(f"{Path(clip).name:<20}{name:<10}{statistics.median(values):>11.1f}{min(values):>8.1f}"
                  f"{max(values):>8.1f}{statistics.median(cpu[clip][name]):>14.2f}")
    if args.json is not None:
        doc = {"argv": list(argv), "host": {"machine": platform.machine(), "cpus": os.cpu_count()},
               "checkouts": checkouts, "options": options, "fps_rounds": fps, "cpu_ms_per_frame_rounds": cpu,
               "median_fps": {c: {n: statistics.median(v) for n, v in by.items()} for c, by in fps.items()},
               "median_cpu_ms_per_frame": {c: {n: statistics.median(v) for n, v in by.items()}
                                           for c, by in cpu.items()}}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
