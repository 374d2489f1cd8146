"""Does a bundle know when it does not know? ``python tools/scene_bench.py``: the runtime's ``scene`` on its own
world's held-out clips and on real clips.

For each ``--bundle`` it captions, with ``EdgeCaptioner`` as a user would
(CPU, one thread), the first window of each held-out clip of its own world
(``--heldout``: folders written by ``python -m models.dataset DIR --clips 200
--seed 12 --splits 0,0,1``; each clip is one window) and every window of each
``--street`` clip (a real street: the goal) and ``--real`` clip (other real
scenes, reported beside it), and counts the windows whose ``Caption.scene`` is
``unknown``. Goals (issue #26): held-out <= 5 %, street >= 90 %.

Beside the runtime's figure, for each set: how many windows each threshold
alone would call unknown (the caption's confidence against
``calibration.confidence``; the cosine of the window's mean feature, computed
again by ``models.domain.window_features`` outside the captioner, against
``calibration.feature``), and whether their union is the runtime's verdict
window for window (``agree``): the captioner's scene checked against a second
path to the same numbers.

Prints a table and the load average, writes JSON (``--json``) and a Markdown
table (``--md``). Every figure is measured on this host (quality, not speed:
no timing goal). Bad input exits 2 with one line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgecap.bundle import load_bundle
from edgecap.command import run_command
from edgecap.errors import ConfigError
from edgecap.outputs import check_output, write_text

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # models/ is a top-level package of the repository, not installed
    sys.path.insert(0, str(REPO))

PROG = "python tools/scene_bench.py"
HELDOUT_MAX = 0.05
STREET_MIN = 0.90
CLIP_SUFFIXES = (".mp4", ".gif", ".avi", ".mkv", ".webm")


def _named(text: str) -> Tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ConfigError(f"--bundle {text!r}: give NAME=DIR, e.g. demo=models/demo/bundle")
    return name, Path(path)


def _clips(paths: Sequence[Path], what: str) -> List[Path]:
    """The clips of ``paths``: files as given, folders' clips/*.mp4 (a models.dataset folder) or *.mp4."""
    out: List[Path] = []
    for p in paths:
        if p.is_dir():
            inside = sorted((p / "clips").glob("*.mp4")) or sorted(p.glob("*.mp4"))
            if not inside:
                raise ConfigError(f"{what} {p}: no .mp4 clip in it or in its clips/; write one with "
                                  "python -m models.dataset DIR --clips 200 --seed 12 --splits 0,0,1")
            out += inside
        elif p.is_file() and p.suffix.lower() in CLIP_SUFFIXES:
            out.append(p)
        else:
            raise ConfigError(f"{what} {p}: not a video file or a folder of clips; give a path that exists")
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _captions(bundle: Path, clips: Sequence[Path], every_window: bool) -> List[Tuple[Path, Any]]:
    """The runtime's captions, each with its clip: the first window of each clip, or every window."""
    from edgecap.captioner import EdgeCaptioner

    out: List[Tuple[Path, Any]] = []
    with EdgeCaptioner(bundle, pipelined=False, num_threads=1) as cap:
        for clip in clips:
            captions = list(cap.stream(str(clip)))
            out += [(clip, c) for c in (captions if every_window else captions[:1])]
    return out


def measure_set(bundle_dir: Path, clips: Sequence[Path], every_window: bool) -> Dict[str, Any]:
    """The runtime's unknown share on one set of clips, with each threshold's and the cross-check's figures."""
    from models.domain import cosines, window_features

    bundle = load_bundle(bundle_dir)
    calib = bundle.calibration
    pairs = _captions(bundle_dir, clips, every_window)
    captions = [c for _, c in pairs]
    scenes = [c.scene for c in captions]
    row: Dict[str, Any] = {"clips": len(clips), "windows": len(captions),
                           "unknown": scenes.count("unknown"), "not_judged": scenes.count(None)}
    row["unknown_share"] = round(row["unknown"] / len(captions), 4) if captions else None
    if every_window:  # a real clip's windows, clip by clip: [unknown, windows]
        row["by_clip"] = {clip.name: [sum(c.scene == "unknown" for p, c in pairs if p == clip),
                                      sum(p == clip for p, _ in pairs)] for clip in clips}
    if not captions or calib is None:
        return row
    by_confidence = np.array([c.confidence < calib.confidence.unknown_below for c in captions])
    verdict = by_confidence.copy()
    row["unknown_by_confidence"] = int(by_confidence.sum())
    if calib.feature is not None:
        features = window_features(bundle_dir, clips, all_windows=every_window)
        if len(features) != len(captions):
            raise RuntimeError(f"{len(features)} windows of features for {len(captions)} captions")
        cos = cosines(features, calib.feature.centroid)
        by_feature = cos < calib.feature.unknown_below
        verdict |= by_feature
        row["unknown_by_feature"] = int(by_feature.sum())
        row["cosine_range"] = [round(float(cos.min()), 4), round(float(cos.max()), 4)]
    row["agree"] = bool(np.array_equal(verdict, np.array([s == "unknown" for s in scenes])))
    row.update(_what_was_said(captions))
    return row


def _what_was_said(captions: List[Any]) -> Dict[str, Any]:
    """The range of the captions' confidences and their commonest texts, unknown scenes and known apart."""
    confidences = [c.confidence for c in captions]
    return {"confidence_range": [round(min(confidences), 6), round(max(confidences), 6)],
            "captions_of_unknown": _top([c.text for c in captions if c.scene == "unknown"]),
            "captions_of_known": _top([c.text for c in captions if c.scene != "unknown"])}


def _top(texts: List[str], n: int = 3) -> List[List[Any]]:
    counts: Dict[str, int] = {}
    for t in texts:
        counts[t] = counts.get(t, 0) + 1
    return [[t, k] for t, k in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def _share(row: Optional[Dict[str, Any]]) -> str:
    if not row or row.get("unknown_share") is None:
        return "–"
    return f"{row['unknown_share']:.1%} ({row['unknown']}/{row['windows']})"


def table(result: Dict[str, Any]) -> str:
    """The Markdown table of a result."""
    lines = ["| bundle | calibration | held-out unknown (goal <= 5 %) | street unknown (goal >= 90 %) | "
             "other real unknown | by confidence / by feature (street) | runtime = cross-check | goals |",
             "|---|---|---|---|---|---|---|---|"]
    for name, b in result["bundles"].items():
        c = b["calibration"]
        rule = "none" if c is None else f"confidence < {c['unknown_below']:g}" + (
            f", cosine < {c['feature_unknown_below']:g}" if c.get("feature_unknown_below") is not None else "")
        sets = b["sets"]
        held = [f"{k.split(':', 1)[1]}: {_share(r)}" for k, r in sets.items() if k.startswith("heldout")]
        street = sets.get("street")
        by = "–"
        if street and "unknown_by_confidence" in street:
            by = f"{street['unknown_by_confidence']} / {street.get('unknown_by_feature', '–')} of {street['windows']}"
        agree = all(r.get("agree", True) for r in sets.values())
        lines.append(f"| {name} | {rule} | {'; '.join(held) or '–'} | {_share(street)} | "
                     f"{_share(sets.get('real'))} | {by} | {'yes' if agree else 'NO'} | "
                     f"{'met' if b['goals_met'] else 'NOT met'} |")
    return "\n".join(lines)


def bench(bundles: List[Tuple[str, Path]], heldout: List[Path], street: List[Path],
          real: List[Path]) -> Dict[str, Any]:
    """Measures every bundle on every set; returns the JSON-ready result."""
    sets = [(f"heldout:{d.name}", _clips([d], "--heldout"), False) for d in heldout]
    sets += [(key, _clips(paths, f"--{key}"), True) for key, paths in (("street", street), ("real", real)) if paths]
    result: Dict[str, Any] = {
        "clips": {str(p): _sha256(p) for key, clips, _ in sets if not key.startswith("heldout") for p in clips},
        "heldout_dirs": {str(d): len(_clips([d], "--heldout")) for d in heldout},
        "goals": {"heldout_unknown_share_max": HELDOUT_MAX, "street_unknown_share_min": STREET_MIN},
        "bundles": {}}
    for name, path in bundles:
        b = load_bundle(path)
        c = b.calibration
        entry: Dict[str, Any] = {
            "path": str(path), "domain": {"kind": b.domain.kind, "about": b.domain.about},
            "calibration": None if c is None else {
                "unknown_below": c.confidence.unknown_below,
                "feature_unknown_below": None if c.feature is None else c.feature.unknown_below},
            "sets": {}}
        for key, clips, every in sets:
            started = time.perf_counter()
            entry["sets"][key] = measure_set(path, clips, every)
            entry["sets"][key]["seconds"] = round(time.perf_counter() - started, 1)
            print(f"{name} {key}: {_share(entry['sets'][key])}", flush=True)
        shares = entry["sets"]
        held_ok = all((r["unknown_share"] or 0.0) <= HELDOUT_MAX for k, r in shares.items() if k.startswith("heldout"))
        street_ok = "street" not in shares or (shares["street"]["unknown_share"] or 0.0) >= STREET_MIN
        entry["goals_met"] = bool(held_ok and street_ok)
        result["bundles"][name] = entry
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", action="append", type=str, metavar="NAME=DIR",
                        help="a bundle to measure (repeatable; default: demo and shapes_mobilenet_v1)")
    parser.add_argument("--heldout", type=Path, nargs="+", default=[],
                        help="folders of held-out clips of the bundles' own world (first window of each)")
    parser.add_argument("--street", type=Path, nargs="*", default=[], help="real street clips (every window)")
    parser.add_argument("--real", type=Path, nargs="*", default=[], help="other real clips (every window)")
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--md", type=Path, help="write the Markdown table here")
    args = parser.parse_args(argv)

    def body() -> int:
        named = [_named(b) for b in args.bundle] if args.bundle else [
            ("demo", REPO / "models" / "demo" / "bundle"),
            ("shapes_mobilenet_v1", REPO / "models" / "shapes_mobilenet_v1" / "bundle")]
        for _, path in named:
            load_bundle(path)  # a bad bundle is one line before minutes of work
        if not args.heldout and not args.street and not args.real:
            raise ConfigError("nothing to measure: give --heldout, --street or --real clips")
        for out, flag in ((args.json, "--json"), (args.md, "--md")):
            if out is not None:
                check_output(out, flag)
        load_before = os.getloadavg()
        started = time.perf_counter()
        result = bench(named, args.heldout, args.street, args.real)
        load_after = os.getloadavg()
        result.update(command=" ".join([PROG, *(argv if argv is not None else sys.argv[1:])]),
                      date=time.strftime("%Y-%m-%d"), seconds=round(time.perf_counter() - started, 1),
                      load_average_before=[round(x, 2) for x in load_before],
                      load_average_after=[round(x, 2) for x in load_after])
        md = table(result)
        print("\n" + md)
        print(f"\nload average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}; "
              f"after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; {result['seconds']:.0f} s")
        if args.json is not None:
            write_text(args.json, json.dumps(result, indent=1) + "\n")
        if args.md is not None:
            write_text(args.md, md + "\n")
        return 0

    return run_command(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
