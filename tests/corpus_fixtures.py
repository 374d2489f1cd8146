"""Tiny MSVD and MSR-VTT corpora in those corpora's exact file formats, for models.video_datasets.

The videos are the project's synthetic clips (``models.dataset.render_clip``),
written with OpenCV as MSVD's ``YouTubeClips/<VideoID>_<Start>_<End>.avi``
(Motion-JPEG AVI) and MSR-VTT's ``TrainValVideo/video<N>.mp4``; the captions
are each clip's own, so a bundle trained on them can be checked. The index
files follow the real ones field for field, quirks included: MSVD's CSV has
descriptions in several languages, empty ones and commas inside quotes;
MSR-VTT's JSON has ``info``, per-video ``category``, ``url``, ``start time``,
``end time``, ``split`` and ``id``, and sentences out of ``sen_id`` order.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Dict, List

import cv2
import numpy as np

from models.dataset import random_spec, render_clip

FPS = 24.0
FRAMES = 24  # one second: a window of 8 frames at 8 fps fits
SIZE = 64


def _clip(path: Path, seed: int, fourcc: str) -> str:
    spec = random_spec(np.random.default_rng(seed), frames=FRAMES, size=SIZE)
    frames, caption = render_clip(spec, seed)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), FPS, (SIZE, SIZE))
    assert writer.isOpened(), path
    for frame in frames:
        writer.write(frame)
    writer.release()
    return caption


def write_msvd(root: Path, clips: int = 6) -> Dict[str, List[str]]:
    """Writes ``root/MSR Video Description Corpus.csv`` and ``root/YouTubeClips/``.

    Returns:
      Clip id -> its English descriptions, in file order.
    """
    videos = root / "YouTubeClips"
    videos.mkdir(parents=True)
    english: Dict[str, List[str]] = {}
    with (root / "MSR Video Description Corpus.csv").open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["VideoID", "Start", "End", "WorkerID", "Source", "AnnotationTime",
                      "Language", "Description"])
        for k in range(clips):
            video, start, end = f"mv89psg6z{k:02d}", 3 * k, 3 * k + 1
            cid = f"{video}_{start}_{end}"
            caption = _clip(videos / f"{cid}.avi", 100 + k, "MJPG")
            rows = [(1508, "unverified", 10, "English", caption),
                    (2210, "clean", 17, "German", "eine Form bewegt sich"),
                    (1701, "unverified", 8, "English", caption.replace("a ", "the ", 1)),
                    (1933, "unverified", 9, "English", ""),  # real rows with no text exist
                    (1188, "clean", 21, "English", f"{caption}, slowly")]
            for worker, source, seconds, language, text in rows:
                out.writerow([video, start, end, worker, source, seconds, language, text])
                if language == "English" and text:
                    english.setdefault(cid, []).append(text)
    return english


def write_msrvtt(root: Path, splits=("train", "train", "train", "validate", "test", "test")
                 ) -> Dict[str, List[str]]:
    """Writes ``root/train_val_videodatainfo.json`` and ``root/TrainValVideo/``.

    Returns:
      Video id -> its captions in ``sen_id`` order.
    """
    videos = root / "TrainValVideo"
    videos.mkdir(parents=True)
    doc = {"info": {"contributor": "Microsoft MSM group", "year": "2016", "version": "1.0"},
           "videos": [], "sentences": []}
    want: Dict[str, List[str]] = {}
    sen_id = 0
    for k, split in enumerate(splits):
        vid = f"video{k}"
        caption = _clip(videos / f"{vid}.mp4", 200 + k, "mp4v")
        doc["videos"].append({"category": 9, "url": f"https://www.youtube.com/watch?v=fixture{k}",
                              "video_id": vid, "start time": 137.72, "end time": 149.44,
                              "split": split, "id": k})
        texts = [caption, f"{caption} on a background", f"there is {caption}"]
        ids = [sen_id + 2, sen_id, sen_id + 1]  # the file lists them out of order
        for text, sid in zip(texts, ids):
            doc["sentences"].append({"caption": text, "video_id": vid, "sen_id": sid})
        want[vid] = [t for _, t in sorted(zip(ids, texts))]
        sen_id += 3
    (root / "train_val_videodatainfo.json").write_text(json.dumps(doc))
    return want
