"""Scores bundles on real data nobody tuned to: COCO val photos, and real clips labelled by eye.

    python -m models.real_bench --bundle models/coco_nanodet/bundle \\
        --images DIR --captions captions_val2017.json --instances instances_val2017.json \\
        --clips DIR --labels models/coco_nanodet/clip_labels.json --json docs/real-bench.json

Photos: each image of ``--instances`` found in ``--images`` is captioned as a
still window (the photo repeated for a whole window) by each bundle through
the runtime (``EdgeCaptioner``), beside the template decoder on the new
bundle's int8 class maps and a constant sentence. Scores: precision and
recall of the COCO object nouns each caption asserts (``coco_words.nouns``)
against the classes annotated in the image, and BLEU-4 and CIDEr-D
(pycocoevalcap, as ``edgecap eval``) against the human captions.

Clips: every window of each clip of ``--labels`` captioned by each bundle; a
claim is an object noun of the caption; a window's labels list the COCO
classes seen in it (by eye). Scores: the share of windows with no false claim
and the share with at least one true claim.

``--dump DIR`` writes, for labelling, one PNG per clip window (its first,
middle and last sampled frames side by side) and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence, Set

import cv2
import numpy as np

from models import coco_words

CONSTANT = "a person"  # COCO's most frequent class, said of every photo and window


def _clean(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def noun_pr(said: Dict[str, Set[int]], truth: Dict[str, Set[int]]) -> Dict[str, float]:
    """Micro precision and recall of asserted classes against annotated ones."""
    tp = sum(len(said[k] & truth[k]) for k in truth)
    claimed = sum(len(said[k]) for k in truth)
    present = sum(len(truth[k]) for k in truth)
    return {"noun_precision": round(tp / claimed, 4) if claimed else 1.0,
            "noun_recall": round(tp / present, 4) if present else 0.0, "claims": claimed}


def clip_scores(captions: Sequence[str], present: Sequence[Set[int]],
                ok: Sequence[Set[int]]) -> Dict[str, float]:
    """Share of windows with no false claim, and of windows showing an object with at least one true claim.

    Args:
      captions: One per window.
      present: Classes seen in each window.
      ok: Classes whose claim is not false in each window, though not required (ambiguous by eye).
    """
    said = [coco_words.nouns(c) for c in captions]
    shown = [i for i, p in enumerate(present) if p]
    return {"windows": len(present), "windows_with_objects": len(shown),
            "no_false_claim": round(float(np.mean([not (s - p - o) for s, p, o in zip(said, present, ok)])), 4),
            "a_true_claim": round(float(np.mean([bool(said[i] & present[i]) for i in shown])), 4)
            if shown else 0.0}


def read_photos(images: Path, captions: Path, instances: Path):
    """The report set: image id -> (path, human captions, annotated class indices)."""
    caps = json.loads(captions.read_text())
    inst = json.loads(instances.read_text())
    index = coco_words.class_index()
    cat = {c["id"]: index[c["name"]] for c in inst["categories"]}
    photos = {}
    for im in inst["images"]:
        path = images / im["file_name"]
        if path.is_file():
            photos[im["id"]] = {"path": path, "refs": [], "truth": set(), "license": im.get("license")}
    for a in caps["annotations"]:
        if a["image_id"] in photos:
            photos[a["image_id"]]["refs"].append(a["caption"])
    for a in inst["annotations"]:
        if a["image_id"] in photos:
            photos[a["image_id"]]["truth"].add(cat[a["category_id"]])
    return {k: v for k, v in photos.items() if v["refs"]}


def caption_stills(bundle_dir: Path, paths: Sequence[Path]) -> List[str]:
    """Each photo captioned by a bundle as a still window, through the runtime."""
    from edgecap.bundle import load_bundle
    from edgecap.captioner import EdgeCaptioner

    bundle = load_bundle(bundle_dir)
    with EdgeCaptioner(bundle, pipelined=False, num_threads=1) as cap:
        return [cap.caption_frames([cv2.imread(str(p))] * bundle.window.frames)[0].text for p in paths]


class Template:
    """The template decoder (``scene_summary.template_scene``) on a bundle's int8 class maps."""

    def __init__(self, bundle_dir: Path):
        from models import scene_summary
        from models.coco_bundle import HeatEncoder

        meta = json.loads((bundle_dir / "bundle.json").read_text())
        self._threshold = float(meta["provenance"]["threshold"])
        self._rule = scene_summary.TemplateRule(self._threshold, meta["provenance"].get("template_motion", 0.08))
        self._encoder = HeatEncoder(bundle_dir / meta["encoder"])

    def __call__(self, window: Sequence[np.ndarray]) -> str:
        """The sentence for a window of BGR frames."""
        from models import scene_summary

        summaries = [scene_summary.summarise(self._encoder(f), self._threshold) for f in window]
        return coco_words.sentence(scene_summary.template_scene(summaries, self._rule))


def template_stills(bundle_dir: Path, paths: Sequence[Path]) -> List[str]:
    """Each photo's sentence from the template decoder, as a still window."""
    template = Template(bundle_dir)
    return [template([cv2.imread(str(p))] * 8) for p in paths]


def photo_table(systems: Dict[str, List[str]], photos: Dict[int, dict]) -> Dict[str, Dict[str, float]]:
    """Noun precision/recall, BLEU-4 and CIDEr-D of each system's captions of the photos."""
    from edgecap_lab.evaluate import score

    keys = [str(k) for k in photos]
    refs = {str(k): [_clean(r) for r in v["refs"]] for k, v in photos.items()}
    truth = {str(k): v["truth"] for k, v in photos.items()}
    table = {}
    for name, captions in systems.items():
        said = dict(zip(keys, captions))
        s = score(refs, {k: _clean(c) for k, c in said.items()})
        table[name] = {**noun_pr({k: coco_words.nouns(c) for k, c in said.items()}, truth),
                       "bleu4": round(s.bleu4, 4), "cider_d": round(s.cider_d, 4)}
    return table


def clip_windows(clip: Path, frames: int, sample_fps: float) -> List[List[np.ndarray]]:
    """A clip's sampled frames cut into windows, as the runtime cuts them (stride = frames)."""
    from edgecap.sources import VideoFileSource, sample

    with VideoFileSource(clip) as src:
        sampled = [f.image for f in sample(src, sample_fps)]
    return [sampled[i:i + frames] for i in range(0, len(sampled) - frames + 1, frames)]


def caption_clip(bundle_dir: Path, clip: Path) -> List[str]:
    """Every window of a clip captioned by a bundle through the runtime."""
    from edgecap.captioner import EdgeCaptioner

    with EdgeCaptioner(bundle_dir, pipelined=False, num_threads=1) as cap:
        return [c.text for c in cap.stream(str(clip))]


def dump_windows(clips: Sequence[Path], out: Path, frames: int = 8, sample_fps: float = 8.0) -> None:
    """Writes each window's first, middle and last frames side by side, for labelling by eye."""
    out.mkdir(parents=True, exist_ok=True)
    for clip in clips:
        for w, window in enumerate(clip_windows(clip, frames, sample_fps)):
            picks = [cv2.resize(window[i], (320, 240)) for i in (0, frames // 2, frames - 1)]
            cv2.imwrite(str(out / f"{clip.stem}_w{w:02d}.png"), np.hstack(picks))


def run(args: argparse.Namespace) -> Dict[str, object]:
    """Runs both tables; returns the report."""
    began = time.perf_counter()
    report: Dict[str, object] = {"load_average_start": os.getloadavg()}
    photos = read_photos(args.images, args.captions, args.instances)
    paths = [v["path"] for v in photos.values()]
    systems = {"bundle": caption_stills(args.bundle, paths), "template": template_stills(args.bundle, paths)}
    for other in args.compare:
        systems[other.parent.name if other.name == "bundle" else other.name] = caption_stills(other, paths)
    systems["constant"] = [CONSTANT] * len(paths)
    report["photos"] = {"images": len(paths), "table": photo_table(systems, photos),
                        "examples": [{"image": p.name, "bundle": b, "template": t, "human": v["refs"][0],
                                      "annotated": sorted(coco_words.CLASSES[c] for c in v["truth"])}
                                     for p, b, t, v in zip(paths, systems["bundle"], systems["template"],
                                                           photos.values())]}
    if args.labels:
        labels = json.loads(args.labels.read_text())
        index = coco_words.class_index()
        clips: Dict[str, object] = {}
        for name in ("bundle", "template", *[str(o) for o in args.compare], "constant"):
            said_all, truth_all, ok_all, per_clip = [], [], [], {}
            for clip, spec in labels["clips"].items():
                truth = [{index[c] for c in w["present"]} for w in spec["windows"]]
                ok = [{index[c] for c in w.get("ok", [])} for w in spec["windows"]]
                if name == "constant":
                    said = [CONSTANT] * len(truth)
                elif name == "template":
                    template = Template(args.bundle)
                    said = [template(w) for w in clip_windows(args.clips / clip, 8, 8.0)]
                else:
                    said = caption_clip(Path(name) if name != "bundle" else args.bundle, args.clips / clip)
                said = said[:len(truth)]
                per_clip[clip] = said
                said_all += said
                truth_all += truth[:len(said)]
                ok_all += ok[:len(said)]
            clips[name] = {**clip_scores(said_all, truth_all, ok_all), "captions": per_clip}
        report["clips"] = clips
    report["load_average_end"] = os.getloadavg()
    report["seconds"] = round(time.perf_counter() - began)
    return report


def format_report(report: Dict[str, object]) -> str:
    """The tables as text."""
    rows = [f"photos ({report['photos']['images']} COCO val2017 images, still windows)",
            f"{'system':<22}{'noun P':>8}{'noun R':>8}{'claims':>8}{'BLEU-4':>8}{'CIDEr-D':>9}"]
    for name, r in report["photos"]["table"].items():
        rows.append(f"{name:<22}{r['noun_precision']:>8.3f}{r['noun_recall']:>8.3f}{r['claims']:>8}"
                    f"{r['bleu4']:>8.3f}{r['cider_d']:>9.3f}")
    if "clips" in report:
        rows.append("clips (windows labelled by eye)")
        rows.append(f"{'system':<40}{'windows':>8}{'no false':>10}{'a true':>8}")
        for name, r in report["clips"].items():
            rows.append(f"{name[-40:]:<40}{r['windows']:>8}{r['no_false_claim']:>10.3f}{r['a_true_claim']:>8.3f}")
    rows.append(f"load average {report['load_average_start']} -> {report['load_average_end']}, "
                f"{report['seconds']} s")
    return "\n".join(rows)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.real_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--compare", type=Path, nargs="*", default=[], help="other bundles (e.g. the demo)")
    parser.add_argument("--images", type=Path)
    parser.add_argument("--captions", type=Path)
    parser.add_argument("--instances", type=Path)
    parser.add_argument("--clips", type=Path, help="folder of the labelled clips")
    parser.add_argument("--labels", type=Path, help="per-window labels (JSON)")
    parser.add_argument("--dump", type=Path, help="write window PNGs of --clips for labelling, then exit")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.dump:
        dump_windows(sorted(p for p in args.clips.iterdir() if p.suffix in (".mp4", ".gif")), args.dump)
        return 0
    report = run(args)
    print(format_report(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=list) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
