"""Adds int8-weight RNN step models to a bundle and measures them against the float ones.

    python -m models.int8_steps models/demo/bundle --data data/shapes2_eval \
        --sample models/demo/sample.mp4 --json results/rnn-int8.json

Writes ``rnn_encoder_step_int8.tflite`` and ``rnn_decoder_step_int8.tflite``
beside the float steps (``models.export.int8_step``), names them in
bundle.json ``rnn.int8``, then captions the sample clip and the first window of
each clip of ``--data`` with both (the runtime's own captioner, int8 CNN
encoder, default beam) and reports caption agreement, step time on this host
(measured) and file sizes. Needs TensorFlow (the rewrite); ``--measure-only``
skips the rewrite and needs only the runtime.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from edgecap.bundle import Bundle, RnnSteps, load_bundle
from edgecap.captioner import EdgeCaptioner
from edgecap.dataset import read_dataset
from edgecap.interpreter import TensorIO, make_cpu_interpreter
from edgecap.rnn import State
from edgecap.sources import VideoFileSource, sample

# Step invokes timed per model, after as many warm-up ones: a median of many
# short invokes, as the host is shared.
TIMED_STEPS = 2000


def add_int8_steps(bundle_dir: Path) -> None:
    """Writes a bundle's int8-weight step models beside its float ones and names them in bundle.json."""
    from models.export import INT8_STEP_FILES, int8_step

    json_path = bundle_dir / "bundle.json"
    meta = json.loads(json_path.read_text())
    for key, filename in INT8_STEP_FILES.items():
        float_step = (bundle_dir / meta["rnn"][key]).read_bytes()
        (bundle_dir / filename).write_bytes(int8_step(float_step))
    meta["rnn"]["int8"] = dict(INT8_STEP_FILES)
    json_path.write_text(json.dumps(meta, indent=2) + "\n")


def _windows(video: Path, bundle: Bundle, first_only: bool) -> List[List[np.ndarray]]:
    """The sampled windows of a clip, as the runtime reads it (BGR)."""
    spec = bundle.window
    with VideoFileSource(video) as src:
        frames = [f.image for f in sample(src, spec.sample_fps)]
    starts = [0] if first_only else range(0, len(frames) - spec.frames + 1, spec.stride)
    return [frames[s:s + spec.frames] for s in starts if len(frames) - s >= spec.frames]


def _captions(bundle: Bundle, windows: Sequence[List[np.ndarray]], float_rnn: bool) -> List[str]:
    with EdgeCaptioner(bundle, pipelined=False, num_threads=1, float_rnn=float_rnn) as cap:
        return [cap.caption_frames(w)[0].text for w in windows]


def _step_ms(steps: RnnSteps, bundle: Bundle) -> Dict[str, float]:
    """Median milliseconds of one encoder step invoke and one decoder step invoke, one thread."""
    state = State.zeros(bundle.hidden_size)
    inputs = {"encoder_step": {"feature": np.zeros((1, bundle.feature_size), np.float32),
                               "h": state.h, "c": state.c},
              "decoder_step": {"word": np.array([bundle.tokens.bos], np.int32), "h": state.h, "c": state.c}}
    out = {}
    for name, path in (("encoder_step", steps.encoder_step), ("decoder_step", steps.decoder_step)):
        run, feed = TensorIO.from_signature(make_cpu_interpreter(path, 1)), inputs[name]
        for _ in range(TIMED_STEPS // 10):
            run(feed)
        times = []
        for _ in range(TIMED_STEPS):
            t0 = time.perf_counter()
            run(feed)
            times.append(time.perf_counter() - t0)
        out[name] = round(statistics.median(times) * 1e3, 4)
    return out


def _agreement(a: Sequence[str], b: Sequence[str]) -> float:
    return sum(x == y for x, y in zip(a, b)) / max(len(a), 1)


def measure(bundle_dir: Path, sample_video: Optional[Path], data: Optional[Path],
            limit: Optional[int]) -> Dict[str, object]:
    """Captions with the float and the int8 steps and times both; returns the report."""
    bundle = load_bundle(bundle_dir)
    if bundle.int8_steps is None:
        raise SystemExit(f"{bundle_dir}: bundle.json names no rnn.int8 steps: run without --measure-only")
    sets: Dict[str, List[List[np.ndarray]]] = {}
    if sample_video is not None:
        sets["sample"] = _windows(sample_video, bundle, first_only=False)
    if data is not None:
        ds = read_dataset(data)
        ids = list(itertools.islice(ds.split("test"), limit))
        sets["heldout"] = [_windows(ds.clip_path(i), bundle, first_only=True)[0] for i in ids]
    report: Dict[str, object] = {"bundle": str(bundle_dir), "data": None if data is None else str(data),
                                 "step_ms": "measured on this host, one thread, median"}
    for name, windows in sets.items():
        floats = _captions(bundle, windows, float_rnn=True)
        int8s = _captions(bundle, windows, float_rnn=False)
        report[name] = {"windows": len(windows), "identical": _agreement(floats, int8s),
                        "differ": [[f, q] for f, q in zip(floats, int8s) if f != q]}
    float_steps = bundle.steps(float_rnn=True)
    for label, steps in (("float", float_steps), ("int8", bundle.int8_steps)):
        report[label] = {"bytes": {"encoder_step": steps.encoder_step.stat().st_size,
                                   "decoder_step": steps.decoder_step.stat().st_size},
                         "step_ms_measured": _step_ms(steps, bundle)}
    return report


def _table(report: Dict[str, object]) -> str:
    rows = [f"{'steps':<6}{'enc KB':>9}{'dec KB':>9}{'enc ms':>9}{'dec ms':>9}  (ms measured, 1 thread)"]
    for label in ("float", "int8"):
        r = report[label]
        rows.append(f"{label:<6}{r['bytes']['encoder_step'] / 1024:>9.0f}{r['bytes']['decoder_step'] / 1024:>9.0f}"
                    f"{r['step_ms_measured']['encoder_step']:>9.3f}{r['step_ms_measured']['decoder_step']:>9.3f}")
    for name in ("sample", "heldout"):
        if name in report:
            rows.append(f"{name}: {report[name]['identical']:.1%} of {report[name]['windows']} windows "
                        "captioned identically by the int8 and the float steps")
    return "\n".join(rows)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.int8_steps", description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--data", type=Path, help="dataset whose test clips are captioned (first window each)")
    parser.add_argument("--limit", type=int, help="only the first N test clips")
    parser.add_argument("--sample", type=Path, help="a clip captioned window by window, e.g. models/demo/sample.mp4")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--measure-only", action="store_true", help="keep the bundle's int8 steps as they are")
    args = parser.parse_args(argv)
    if not args.measure_only:
        add_int8_steps(args.bundle)
    report = measure(args.bundle, args.sample, args.data, args.limit)
    print(_table(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
